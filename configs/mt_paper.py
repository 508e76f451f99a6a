"""The paper's translation preset (its appendix): 6 + 6 blocks, d 512, FFN 2048, 8 heads, 32 experts of 3
sublayers in 2 MoE layers (after encoder and decoder block 3), 64K sentencepiece vocabulary, max length 256,
512K tokens a batch, Adam (0.9, 0.98), lr 5e-4 inverse-sqrt after 4K warmup steps, 352K steps of which 30K
stage 1, clip 0.1, dropout 0.1, label smoothing 0.1.

The paper trains on WMT (fr, cs, de, fi, lv, et, ro, hi, tr into English): configs/mt_wmt.py; this preset reads
the offline Multi30k + Bible pairs of configs/mt_cpu.py.
"""
from configs import mt_cpu


def get_config():
  config = mt_cpu.get_config()
  config.data.sentencepiece_vocab_size = 64_000
  model = config.model
  model.d_model, model.num_heads, model.num_layers, model.d_ff = 512, 8, 6, 2048
  model.max_len = 256
  model.dropout = 0.1
  model.dtype = "bfloat16"
  model.moe.num_experts = 32
  model.moe.sublayers_per_expert = 3  # per MoE layer
  model.moe.placement = "middle"
  train = config.train
  train.steps = 352_000
  train.stage1_steps = 30_000
  train.batch_size = 2048  # x 256 positions = 512K tokens
  train.microbatches = 8
  train.seq_len = 256
  train.learning_rate = 5e-4
  train.warmup_steps = 4_000
  train.adam_b1, train.adam_b2 = 0.9, 0.98
  train.clip_norm = 0.1
  train.label_smoothing = 0.1
  train.log_every = 100
  train.eval_every = 5_000
  train.checkpoint_every = 5_000
  config.eval.batch_size = 256
  config.eval.seq_len = 256
  return config

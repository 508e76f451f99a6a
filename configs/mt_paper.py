"""The paper's translation preset (its appendix): 6 + 6 blocks, d 512, FFN 2048, 8 heads, 32 experts of 3
sublayers in 2 MoE layers (after encoder and decoder block 3), 64K sentencepiece vocabulary, max length 256,
512K tokens a batch, Adam (0.9, 0.98), lr 5e-4 inverse-sqrt after 4K warmup steps, 352K steps of which 30K
stage 1, clip 0.1, dropout 0.1, label smoothing 0.1 (Adam's betas, the clip, the dropout, the label smoothing and the
placement after the middle block are configs/mt_cpu.py's already; this file states what it changes).

The paper trains on WMT (fr, cs, de, fi, lv, et, ro, hi, tr into English): configs/mt_wmt.py. This preset is the
paper's model on the offline Multi30k + Bible pairs of configs/mt_cpu.py (prepared by the run itself), to try the
model's size and speed without WMT; it is no reproduction of the paper's numbers. Your own parallel files are one
override away, the config's: ``--config configs/mt_files.py:mt_paper`` with the pairs and globs its docstring gives.
Fits 1 to 64 devices with no override: one routing group per device (``model.moe.num_groups=0``, chosen at launch
and recorded with the run) and a routing sample of 64 pairs.
"""
from configs import mt_cpu


def get_config():
  config = mt_cpu.get_config()
  config.data.sentencepiece_vocab_size = 64_000
  model = config.model
  model.d_model, model.num_heads, model.num_layers, model.d_ff = 512, 8, 6, 2048
  model.max_len = 256
  model.dtype = "bfloat16"
  model.moe.num_experts = 32
  model.moe.sublayers_per_expert = 3  # per MoE layer
  train = config.train
  train.steps = 352_000
  train.stage1_steps = 30_000
  train.batch_size = 2048  # x 256 positions = 512K tokens
  train.microbatches = 8
  train.seq_len = 256
  train.learning_rate = 5e-4
  train.warmup_steps = 4_000
  train.log_every = 100
  train.eval_every = 5_000
  train.checkpoint_every = 5_000
  config.eval.batch_size = 256
  config.eval.seq_len = 256
  # Routing records of 64 validation pairs (one per device on up to 64 devices) every 2,000 steps: 176 records.
  config.analysis.sample_tokens = 64 * 256
  config.analysis.record_every = 2_000
  return config

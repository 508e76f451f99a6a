"""CPU default: a small StableMoE LM on Penn Treebank, both stages, in about 15 minutes on 2 cores.

Run: python -m stablemoe_jax.main --config configs/default.py --workdir runs/default
Override any value: --config.train.steps=200 --config.model.moe.num_experts=4
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.corpus = "ptb"  # "ptb" | "text" (a user's own train/valid/test.txt)
  config.data.data_dir = ""  # "" -> $STABLEMOE_DATA_DIR
  config.data.tokenizer = "word"  # "word" | "sentencepiece"
  config.data.sentencepiece_vocab_size = 8000

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = 0  # 0 -> the tokenizer's; otherwise must be >= it
  config.model.d_model = 256
  config.model.num_heads = 4
  config.model.num_layers = 4
  config.model.d_ff = 1024
  config.model.max_len = 128
  config.model.dropout = 0.05
  config.model.dtype = "float32"

  config.model.moe = ml_collections.ConfigDict()
  config.model.moe.enabled = True
  config.model.moe.router = "stablemoe"
  config.model.moe.num_experts = 8
  config.model.moe.placement = "middle"  # bottom | middle | top | scattered
  config.model.moe.sublayers_per_expert = 2
  config.model.moe.d_ff = 0  # 0 -> model.d_ff
  config.model.moe.capacity_factor = 2.0
  config.model.moe.eval_capacity_factor = 0.0  # <= 0: no token is dropped at evaluation
  # Routing groups G: capacity ceil(cf * T / G / E) per (group, expert); a multiple of the device count.
  config.model.moe.num_groups = 1
  config.model.moe.shuffle_tokens = True  # training: random order within a group before capacity (drops random)
  # auto (all_to_all if mesh.expert > 1, else index) | index | all_to_all | one_hot (benchmark)
  config.model.moe.dispatcher = "auto"
  # Each router's own settings, read (and validated) only when that router is chosen.
  config.model.moe.stablemoe = ml_collections.ConfigDict()
  config.model.moe.stablemoe.balance_alpha = 0.3
  config.model.moe.stablemoe.distill_weight = 1.0  # the paper; the authors' code uses 0.3
  config.model.moe.stablemoe.distill_dim = 50
  config.model.moe.stablemoe.centroid_gain = 0.1

  config.train = ml_collections.ConfigDict()
  config.train.steps = 850
  config.train.stage1_steps = 85  # 10% of training, as in the paper
  config.train.batch_size = 16
  config.train.microbatches = 1  # >1: accumulate gradients over batch_size / microbatches rows at a time
  config.train.seq_len = 128
  config.train.learning_rate = 2e-3
  config.train.warmup_steps = 100
  config.train.adam_b1 = 0.9
  config.train.adam_b2 = 0.98
  config.train.adam_eps = 1e-8
  config.train.clip_norm = 0.1
  config.train.log_every = 50
  config.train.eval_every = 425
  config.train.eval_batches = 20  # validation batches per in-training evaluation; <= 0: whole split
  config.train.checkpoint_every = 200
  config.train.keep_checkpoints = 3

  # Device mesh (data, expert) over all devices of all processes; data = devices / expert.
  config.mesh = ml_collections.ConfigDict()
  config.mesh.expert = 1  # devices sharing the experts (E / expert each); must divide E and the device count

  config.eval = ml_collections.ConfigDict()
  config.eval.batch_size = 32
  config.eval.seq_len = 128
  return config

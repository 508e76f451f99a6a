"""CPU translation preset: StableMoE X->English on Multi30k (de, fr, cs) and the Bible (es), on 2 cores.

Run: python -m stablemoe_jax.main --config configs/mt_cpu.py --workdir runs/mt_cpu
The Bible's held-out books (no verse of them is trained on): valid Ruth, Jonah, Philippians;
test Esther, James, 1 John. Override any value, e.g. --config.train.steps=200.

The translation config at the settings' defaults (stablemoe_jax/core/settings/: the data section, the decoding and
the translation-only train and eval keys are this preset's there), the CPU default's model (4 encoder + 4 decoder
blocks of d 256, an MoE layer of 8 experts after encoder block 2 and after decoder block 2; the paper: after the 3rd
of 6), and what this file changes below. Each training batch is of one length bucket L in (16, 32, 64),
[64 * 64 / L, L] (data.length_buckets=3; docs/translation.md).
"""
import ml_collections

from stablemoe_jax.core import settings


def get_config() -> ml_collections.ConfigDict:
  config = settings.config_dict(settings.RunSettings, task="translation")

  model = config.model
  model.max_len = 64
  model.dropout = 0.1
  model.moe.sublayers_per_expert = 1
  # The paper's dot-product routing (the LM default's cosine routing was not measured on translation).
  model.moe.stablemoe.affinity, model.moe.stablemoe.cosine_dim = "dot", 0

  train = config.train
  train.steps = 1200  # about an hour on 2 quiet cores (the step time: docs/gpu.md, GPU-hours per preset)
  train.stage1_steps = 200
  train.batch_size = 64
  train.seq_len = 64  # source and target positions (tag and eos / bos included); longer pairs are counted, not used
  train.schedule = "inverse_sqrt"
  train.learning_rate = 1e-3
  train.warmup_steps = 200
  train.label_smoothing = 0.1
  train.eval_every = 500
  train.eval_batches = 10
  train.checkpoint_every = 500

  config.eval.batch_size = 64
  config.eval.seq_len = 64

  # Routing records of a fixed sample of validation pairs (encoder: sources, decoder: targets), 31 over the run;
  # the sample (analysis.sample_tokens, 4096): 64 pairs of train.seq_len.
  config.analysis.record_every = 100
  return config

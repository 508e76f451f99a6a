"""The paper's translation comparison (Table 4) at CPU scale: StableMoE, Switch, BASE, Hash and the dense models
on configs/mt_cpu.py's model and data (Multi30k de/fr/cs + Bible es -> en).

Run: python -m stablemoe_jax.compare --config configs/compare_mt_cpu.py --workdir runs/compare_mt
Subsets and seeds: --config.compare.methods=stablemoe,dense --config.compare.seeds=3
Every method is configs/mt_cpu.py's model with its overrides from stablemoe_jax/compare/methods.py, trained
under this file's budget; the table has the validation loss and test BLEU per pair and their average.
"""
import ml_collections

from configs import mt_cpu


def get_config() -> ml_collections.ConfigDict:
  config = mt_cpu.get_config()
  config.train.steps = 1000  # of mt_cpu's 1,200
  config.train.stage1_steps = 200
  # Cheaper real target tokens (docs/speed.md, "The translation step"): packed rows, the head's loss in chunks,
  # and the final BLEU on each pair's table column only.
  config.data.pack_pairs, config.data.length_buckets = True, 1
  config.model.loss_chunk_tokens = 1024
  config.decode.sets = "primary"
  config.train.eval_every = 250  # points of the convergence plot
  config.train.checkpoint_every = 250
  config.analysis.record_every = 50  # routing records for the fluctuation column (21 a run)

  config.compare = ml_collections.ConfigDict()
  # Comma-separated names from stablemoe_jax/compare/methods.py METHODS, run in this order. base_fixed is left out
  # (the LM comparison's ablation); add it with --config.compare.methods=...,base_fixed.
  config.compare.methods = "stablemoe,switch,base,hash,dense,dense_flops,dense_deeper,dense_wider"
  config.compare.seeds = 1  # runs per method, with seeds config.seed, config.seed + 1, ...
  return config

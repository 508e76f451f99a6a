"""X-MoE's routing as published against the cosine routing of the CPU default (issue 39; docs/tuning.md, "Ablations").

- StableMoE-cosine (the default's router: expert embeddings start at norm 0.1 and are never rescaled) at its tuned
  choice, 6e-3 / 400: its seeds 1-3 are the tuned sweep's runs (results/tune_h100), nothing trains for it;
- StableMoE with X-MoE's expert embeddings as published (`model.moe.stablemoe.cosine_expert_norm=1.5`: orthogonal
  init at gain 0.32, every row rescaled to norm 1.5 after each update; models/cosine_routing.py), its own choice made
  on seed 0 over lr {4e-3, 6e-3, 8e-3} at warmup 400 (the cells where the cosine router is alive), then seeds 1-3.

The report pairs the two seed by seed (valid and test PPL with 95% intervals) beside the distilled router's agreement
at the freeze, the routing fluctuation, the mean gate and what the layer is worth. Six runs of 850 steps.
  python -m stablemoe_jax.compare --config configs/xmoe_cpu.py --workdir /tmp/xmoe
"""
import ml_collections

from configs import tune_cpu


def get_config() -> ml_collections.ConfigDict:
  config = tune_cpu.get_config()
  config.compare.methods = "stablemoe_cosine,stablemoe_xmoe"
  config.compare.grid.learning_rate = config.compare.grid.warmup_steps = config.compare.grid.extra = ""
  config.compare.grid.per_method = "stablemoe_cosine=6e-3/400;stablemoe_xmoe=4e-3/400,6e-3/400,8e-3/400"
  config.compare.pairs = "stablemoe_xmoe:stablemoe_cosine"
  return config

"""The paper's Table 5 at laptop scale: fixed routing against learned routing, each at its method's tuned setting,
seeds 1-3, paired (docs/tuning.md, "Ablations").

- BASE Layer against BASE Layer + fixed routing (the paper: fixed routing 0.63 PPL better), at BASE's choice;
- StableMoE (the CPU default's router) against StableMoE with stage 1 only (routing learned for the whole run, never
  distilled and frozen; the paper: 0.20 PPL worse), at its choice.

Each method has one setting (no selection run); its seeds 1-3 are the tuned sweep's runs where they exist
(results/tune_h100: BASE's and StableMoE-cosine's are shared, only the ablations train).
  python -m stablemoe_jax.compare --config configs/ablate_cpu.py --workdir /tmp/ablate
"""
import ml_collections

from configs import tune_cpu


def get_config() -> ml_collections.ConfigDict:
  config = tune_cpu.get_config()
  config.compare.methods = "base,base_fixed,stablemoe_cosine,stablemoe_cosine_stage1_only"
  config.compare.grid.learning_rate = config.compare.grid.warmup_steps = config.compare.grid.extra = ""
  # The tuned sweep's choices (results/tune_h100/comparison.md): BASE 4e-3 / 400, StableMoE-cosine 6e-3 / 400.
  config.compare.grid.per_method = ("base=4e-3/400;base_fixed=4e-3/400;"
                                    "stablemoe_cosine=6e-3/400;stablemoe_cosine_stage1_only=6e-3/400")
  config.compare.pairs = "base_fixed:base,stablemoe_cosine_stage1_only:stablemoe_cosine"
  return config

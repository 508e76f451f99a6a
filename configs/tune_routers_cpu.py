"""Routers after StableMoE asked StableMoE's question (issue 52, part 4): does their routing keep changing, and
what does it cost? Top-2 Switch, DeepSeek-V3's bias-balanced top-2 and the latter with one shared expert, tuned by
configs/tune_cpu.py's rule at its budget and reported beside its rows.

Run (resumable; the tuned table's runs are found in results/tune_h100 and not trained again, so only the three new
methods train: 2 settings on seed 0, then seeds 1-3 at each one's choice, 15 runs):
  python -m stablemoe_jax.compare --config configs/tune_routers_cpu.py --workdir runs/tune_routers
Several workers (one GPU, or many cores):
  WORKERS=4 bash launch/sweep_workers.sh configs/tune_routers_cpu.py runs/tune_routers
Report what has finished without training: add --config.compare.report_only=True.

Budget: configs/default.py's (850 steps of 16 x 128 PTB tokens, 300 in stage 1), as for every row of the tuned
table. The new methods' grid is that table's best cells (warmup 400 at lr 6e-3, the choice of dense, Switch and
cosine StableMoE, and 4e-3, that of dot StableMoE and BASE); what they leave untuned: top_k (2), the bias update
rate (1e-3, DeepSeek-V3's), routed_scale (1), the balance weights. The report's k-set column gives the share of
tokens whose set of 2 experts changes after 20/50/80% of training, beside the first choice's.
"""
import ml_collections

from configs import tune_cpu

NEW_METHODS = ("switch_top2", "deepseek", "deepseek_shared")
BEST_CELLS = "6e-3/400,4e-3/400"


def get_config() -> ml_collections.ConfigDict:
  config = tune_cpu.get_config()
  config.compare.methods = ",".join([config.compare.methods, *NEW_METHODS])
  config.compare.grid.per_method = ";".join([config.compare.grid.per_method,
                                             *(f"{name}={BEST_CELLS}" for name in NEW_METHODS)])
  return config

"""Every method at its best on the CPU default's budget: a learning-rate x warmup grid per method, the choice on
seed 0's validation perplexity, seeds 1-3 at each method's choice reported (docs/tuning.md).

Run (resumable; every finished run's small files go to results/tune_h100, the sweep's committed results, and a run
found there is not trained again):
  python -m stablemoe_jax.compare --config configs/tune_cpu.py --workdir /tmp/tune
Report what has finished without training: add --config.compare.report_only=True.
Several workers on one machine (one GPU, or many cores): WORKERS=2 bash launch/sweep_workers.sh configs/tune_cpu.py /tmp/tune

Budget: configs/default.py's (850 steps of 16 x 128 tokens on PTB, 300 in stage 1), the same for every method; only
train.learning_rate and train.warmup_steps vary, over the grid below. A setting whose MoE layer is dead by the
health verdict (removing it costs < 1% of validation perplexity, or degenerate routing) is not eligible; a choice
whose layer dies in one of its reported seeds is rejected for the next live one.
"""
import ml_collections

from configs import compare_cpu, default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.compare = compare_cpu.get_config().compare
  config.compare.methods = "dense,stablemoe_all,stablemoe_cosine,stablemoe_assigned,hash,switch,base,switch_cosine"
  config.compare.seeds = 3
  config.compare.grid.learning_rate = "4e-3,2e-3,1e-3"  # the likeliest winners first
  config.compare.grid.warmup_steps = "400,40"
  # Settings past the cross product's corner (lr 4e-3, warmup 400), not its every cell; why: docs/tuning_log.md,
  # "Notes moved from the configs".
  config.compare.grid.extra = "6e-3/400,8e-3/400,4e-3/600,6e-3/600,8e-3/600"
  # Equal effort (issue 38): X-MoE's routing, designed for a softmax router, on Switch at Switch's three best
  # settings; the dot-product StableMoE explored around its live settings as finely as dense around its own.
  config.compare.grid.per_method = ("switch_cosine=6e-3/400,4e-3/400,8e-3/400;"
                                    "stablemoe_all=+4e-3/100,4e-3/200,6e-3/40,8e-3/40")
  config.compare.grid.steps = 0  # select at the full 850 steps: the grid's run is seed 0 of its setting
  config.compare.results_dir = "results/tune_h100"  # every finished run of the sweep (H100 and CPU alike)
  return config

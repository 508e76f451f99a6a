"""The paper's Table 4 at CPU scale, every method at its best: X->English translation (configs/compare_mt_cpu.py's
model, data and budget), each method's learning rate chosen on seed 0's validation NLL, seeds 1-3 at each choice
reported and paired with dense.

Run (resumable; every finished run's small files go to results/tune_mt_cpu, and a run found there is not trained
again):
  python -m stablemoe_jax.compare --config configs/tune_mt_cpu.py --workdir runs/tune_mt
Two at a time on 2 cores: WORKERS=2 bash launch/sweep_workers.sh configs/tune_mt_cpu.py runs/tune_mt
Report what has finished without training: add --config.compare.report_only=True.

Budget: 1,000 steps of 64 x 64 packed positions (200 in stage 1), the same for every method; only
train.learning_rate varies (inverse-sqrt schedule, warmup 200). A setting whose model is dead by the health verdict
is not eligible; its two MoE layers are judged as a whole (a weak layer beside a working one rejects nothing). Not tuned: warmup, dropout, clip, label smoothing, the balance-loss weights.
"""
import ml_collections

from configs import compare_cpu, compare_mt_cpu


def get_config() -> ml_collections.ConfigDict:
  config = compare_mt_cpu.get_config()
  config.compare = compare_cpu.get_config().compare
  config.compare.methods = "stablemoe,dense,switch,base,hash,dense_flops"
  config.compare.seeds = 3
  config.compare.grid.learning_rate = "2e-3,1e-3"
  config.compare.grid.warmup_steps = "200"
  config.compare.grid.steps = 0  # select at the full 1,000 steps: the grid's run is seed 0 of its setting
  config.compare.results_dir = "results/tune_mt_cpu"
  # The paper's ordering (StableMoE > BASE > Hash > Switch > the larger dense > dense), pair by pair on seeds 1-3.
  config.compare.contrasts = ("stablemoe:base,stablemoe:hash,stablemoe:switch,base:hash,base:switch,hash:switch,"
                              "dense_flops:dense,stablemoe:dense_flops,base:dense_flops,hash:dense_flops,"
                              "switch:dense_flops")
  config.train.eval_every = 125  # 7 points of validation NLL against target tokens (Figure 5's shape)
  config.train.checkpoint_every = 125
  return config

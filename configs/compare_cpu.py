"""The paper's comparison (Table 3) at CPU scale: 8 methods, 3-9 minutes each per seed on 2 cores (dense fastest).

Run: python -m stablemoe_jax.compare --config configs/compare_cpu.py --workdir runs/compare
Subsets and seeds: --config.compare.methods=stablemoe,dense --config.compare.seeds=3
Every method is the CPU default's model (configs/default.py) with its overrides from
stablemoe_jax/compare/methods.py, trained under this file's budget.
"""
import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.train.steps = 200  # 200 x 16 x 128 = 410K tokens (under half a PTB epoch) per method
  config.train.stage1_steps = 70  # routing learned (and distilled, for fixed-routing variants) in the first third
  # The settings its committed tables were measured at (results/compare_cpu_3seeds), the CPU default's before the
  # tuned sweep: lr 1e-3 and the paper's dot-product routing (its "stablemoe" is balance_scope=all, dot).
  config.train.learning_rate = 1e-3
  config.train.warmup_steps = 20
  config.model.moe.stablemoe.affinity, config.model.moe.stablemoe.cosine_dim = "dot", 0
  config.train.eval_every = 50  # points of the convergence plot
  config.train.eval_batches = 0  # the whole validation split at each point (PTB: 18 batches)
  config.train.checkpoint_every = 100
  config.analysis.record_every = 10  # routing records for the fluctuation curves

  config.compare = ml_collections.ConfigDict()
  # Comma-separated names from stablemoe_jax/compare/methods.py METHODS, run in this order.
  config.compare.methods = "stablemoe,switch,base,hash,base_fixed,dense,dense_deeper,dense_wider"
  config.compare.seeds = 1  # runs per method, with seeds config.seed, config.seed + 1, ...
  # Tuning (stablemoe_jax/compare/sweep.py, configs/tune_cpu.py): comma-separated grids; both empty: no tuning.
  config.compare.grid = ml_collections.ConfigDict()
  config.compare.grid.learning_rate = ""  # e.g. "1e-3,2e-3,4e-3"
  config.compare.grid.warmup_steps = ""  # e.g. "40,400"
  config.compare.grid.extra = ""  # settings beyond the cross product, "LR/WARMUP" pairs, e.g. "6e-3/400,6e-3/600"
  config.compare.grid.per_method = ""  # "METHOD=LR/W,...": its own grid; "METHOD=+LR/W,...": the shared one and more
  config.compare.grid.steps = 0  # the selection runs' budget; 0: train.steps (a shorter one scales stage1_steps)
  # A folder (e.g. results/tune_cpu, committed) that gets each finished run's summary.json, metrics.jsonl and
  # fluctuation.json; a run found there is not redone, so a sweep resumes on another machine. "": none.
  config.compare.results_dir = ""
  # Paired differences in the report: "" pairs every method with dense; "ABLATION:BASELINE,..." pairs each ablation
  # with the method it ablates instead (configs/ablate_cpu.py).
  config.compare.pairs = ""
  # Contrasts beside that pairing, "A:B,...": each A paired with B on the same seeds (e.g. router against router).
  config.compare.contrasts = ""
  config.compare.report_only = False  # True: train nothing, report the finished runs
  return config

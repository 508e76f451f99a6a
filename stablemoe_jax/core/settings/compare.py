"""The comparison command's section ``compare`` and its tuning grid ``compare.grid``, as frozen dataclasses.

The defaults are configs/compare_cpu.py's (its section is built from them); a field whose ``absent`` metadata
differs from its default is one a config without the key (a hand-built section, configs/compare_mt_cpu.py) reads
otherwise. The readers and their checks:
``compare/methods.py`` (methods, seeds), ``compare/sweep.py`` (the grid), ``compare/runner.py`` (results_dir),
``compare/report.py`` (pairs, contrasts).
"""
from __future__ import annotations

import dataclasses

from stablemoe_jax.core.settings.routers import setting


@dataclasses.dataclass(frozen=True)
class GridSettings:
  """``compare.grid``: the learning-rate x warmup settings each method is tuned over (every list empty: no tuning)."""

  learning_rate: str = setting("", "comma-separated learning rates, e.g. 1e-3,2e-3,4e-3; empty: train.learning_rate "
                                   "(when warmup_steps is set)")
  warmup_steps: str = setting("", "comma-separated warmup steps, e.g. 40,400; empty: train.warmup_steps (when "
                                  "learning_rate is set)")
  extra: str = setting("", "settings beyond the cross product, LR/WARMUP pairs, e.g. 6e-3/400,6e-3/600")
  per_method: str = setting("", "METHOD=LR/W,...: the method's own grid; METHOD=+LR/W,...: the shared one and more; "
                                "methods separated by ;")
  steps: int = setting(0, "the selection runs' budget; 0: train.steps (a shorter one scales stage1_steps)")


@dataclasses.dataclass(frozen=True)
class CompareSettings:
  """``compare``: the methods compared, their seeds, the tuning grid, where finished runs are kept, the pairing."""

  methods: str = setting("stablemoe,switch,base,hash,base_fixed,dense,dense_deeper,dense_wider",
                         "comma-separated names of compare/methods.py's METHODS, run in this order", absent="")
  seeds: int = setting(1, "runs per method, with seeds config.seed, config.seed + 1, ...")
  grid: GridSettings = dataclasses.field(default_factory=GridSettings,
                                         metadata={"help": "the tuning grid (compare/sweep.py)"})
  results_dir: str = setting("", "a folder (e.g. results/tune_cpu, committed) that gets each finished run's "
                                 "summary.json, metrics.jsonl and fluctuation.json; a run found there is not "
                                 "redone, so a sweep resumes on another machine; empty: none")
  pairs: str = setting("", "ABLATION:BASELINE,...: each ablation paired with the method it ablates in the report "
                           "(configs/ablate_cpu.py); empty: every method with dense")
  contrasts: str = setting("", "A:B,...: beside that pairing, each A paired with B on the same seeds in the "
                               "report's contrasts table (e.g. router against router); empty: none")
  report_only: bool = setting(False, "True: train nothing, report the finished runs")

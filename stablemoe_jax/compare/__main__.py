"""``python -m stablemoe_jax.compare --config configs/compare_cpu.py --workdir DIR [--config.a.b=v ...]``.

Trains every method of ``compare.methods`` for ``compare.seeds`` seeds under the same budget, in
``DIR/<method>/seed<k>`` (rerun the command to resume: finished runs are kept, a killed one resumes
from its checkpoint), then writes DIR/comparison.md, DIR/comparison.json and DIR/convergence.png.
With ``compare.grid`` set (configs/tune_cpu.py), each method is first tuned over a learning-rate x warmup
grid and its seeds run at its choice (compare/sweep.py). ``--config.compare.report_only=True`` trains nothing,
with or without a grid, and reports the finished runs.
"""
from __future__ import annotations

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from stablemoe_jax import cli
from stablemoe_jax.compare import report, runner, sweep, sweep_report
from stablemoe_jax.compare.comparison import Comparison

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config with a compare section, e.g. "
                                          "configs/compare_cpu.py.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every run and the comparison's outputs.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  absl_logging.set_verbosity(absl_logging.WARNING)
  comparison = Comparison.of(_CONFIG.value)
  report.pairs_of(comparison)  # a bad compare.pairs or compare.contrasts stops here, before any training
  report.contrasts_of(comparison)
  train = not comparison.settings.report_only
  workdir = _WORKDIR.value
  if sweep.parse_grid(comparison) is not None:  # each method at its best: a grid, the choice, seeds at the choice
    result = sweep.run_sweep(comparison, workdir, train=train)
    rows = sweep_report.write_sweep_reports(comparison, result, workdir)
    labels = {name: name for name in result["grid"]}
    print(sweep_report.grid_table(result, labels))
    if rows:
      print(report.markdown_table(rows, sweep_report.sweep_columns(rows)))
    print(f"wrote {workdir}/comparison.md and comparison.json", flush=True)
    return
  records = runner.run_all(comparison, workdir, train=train)
  if not records:
    print(f"no finished run in {workdir} (compare.report_only trains nothing); nothing to report.", flush=True)
    return
  rows = report.write_reports(comparison, records, workdir)
  print(report.markdown_table(rows))
  print(f"wrote {workdir}/comparison.md, comparison.json and convergence.png", flush=True)


def run() -> None:
  cli.run_app(main)


if __name__ == "__main__":
  run()

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
from stablemoe_jax.core.settings import typed
from stablemoe_jax.core.settings.compare import CompareSettings
from stablemoe_jax.experiment.config_validation import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config with a compare section, e.g. "
                                          "configs/compare_cpu.py.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every run and the comparison's outputs.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  absl_logging.set_verbosity(absl_logging.WARNING)
  config = _CONFIG.value
  if "compare" not in config:
    raise ConfigError(f"the config has no compare section (compare.methods, compare.seeds); "
                      f"use --config configs/compare_cpu.py or add one.")
  report.pairs_of(config)  # a bad compare.pairs or compare.contrasts stops here, before any training
  report.contrasts_of(config)
  train = not typed(CompareSettings, config.compare, "compare").report_only
  if sweep.parse_grid(config) is not None:  # each method at its best: a grid, the choice, seeds at the choice
    result = sweep.run_sweep(config, _WORKDIR.value, train=train)
    rows = sweep_report.write_sweep_reports(config, result, _WORKDIR.value)
    labels = {name: name for name in result["grid"]}
    print(sweep_report.grid_table(result, labels))
    if rows:
      print(report.markdown_table(rows, sweep_report.sweep_columns(rows)))
    print(f"wrote {_WORKDIR.value}/comparison.md and comparison.json", flush=True)
    return
  records = runner.run_all(config, _WORKDIR.value, train=train)
  if not records:
    print(f"no finished run in {_WORKDIR.value} (compare.report_only trains nothing); nothing to report.", flush=True)
    return
  rows = report.write_reports(config, records, _WORKDIR.value)
  print(report.markdown_table(rows))
  print(f"wrote {_WORKDIR.value}/comparison.md, comparison.json and convergence.png", flush=True)


def run() -> None:
  cli.run_app(main)


if __name__ == "__main__":
  run()

"""``python -m stablemoe_jax.compare --config configs/compare_cpu.py --workdir DIR [--config.a.b=v ...]``.

Trains every method of ``compare.methods`` for ``compare.seeds`` seeds under the same budget, in
``DIR/<method>/seed<k>`` (rerun the command to resume: finished runs are kept, a killed one resumes
from its checkpoint), then writes DIR/comparison.md, DIR/comparison.json and DIR/convergence.png.
"""
from __future__ import annotations

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from stablemoe_jax import cli
from stablemoe_jax.compare import report, runner
from stablemoe_jax.config_validation import ConfigError

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
  records = runner.run_all(config, _WORKDIR.value)
  rows = report.write_reports(config, records, _WORKDIR.value)
  print(report.markdown_table(rows))
  print(f"wrote {_WORKDIR.value}/comparison.md, comparison.json and convergence.png", flush=True)


def run() -> None:
  cli.run_app(main)


if __name__ == "__main__":
  run()

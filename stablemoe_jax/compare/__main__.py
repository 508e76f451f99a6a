"""``python -m stablemoe_jax.compare --config configs/compare_cpu.py --workdir DIR [--config.a.b=v ...]``.

Trains every method of ``compare.methods`` for ``compare.seeds`` seeds under the same budget, in
``DIR/<method>/seed<k>`` (rerun the command to resume: finished runs are kept, a killed one resumes
from its checkpoint), then writes DIR/comparison.md, DIR/comparison.json and DIR/convergence.png.
"""
from __future__ import annotations

import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from stablemoe_jax.compare import report, runner
from stablemoe_jax.config_validation import ConfigError
from stablemoe_jax.data import DataNotFoundError
from stablemoe_jax.train import loop
from stablemoe_jax.train.checkpoint import CheckpointMismatchError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config with a compare section, e.g. "
                                          "configs/compare_cpu.py.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every run and the comparison's outputs.")
flags.mark_flags_as_required(["config", "workdir"])
USER_ERRORS = (ConfigError, DataNotFoundError, CheckpointMismatchError, loop.NonFiniteLossError, FileNotFoundError)


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


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError, flags.Error) as error:
    message = str(error).strip("'\"").replace("\\n", " ").replace("\n", " ")
    print(f"error: bad flag or config override: {message}\nEvery config key is listed in the file given to --config.",
          file=sys.stderr)
    sys.exit(2)


def run() -> None:
  try:
    app.run(main, flags_parser=_parse_flags)
  except USER_ERRORS as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  run()

"""Entry point: ``python -m stablemoe_jax.main --config configs/default.py --workdir DIR [--mode=eval]``.

Any config value can be overridden on the command line, ml_collections style:
``--config.train.steps=200 --config.model.moe.num_experts=4``.
"""
from __future__ import annotations

import json
import sys

import jax
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from stablemoe_jax.train import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, tokenizer and data.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (resumes if possible) or eval a checkpoint.")
_STEP = flags.DEFINE_integer("step", None, "--mode=eval: checkpoint step to restore (default: latest).")
_SPLIT = flags.DEFINE_enum("split", "valid", ["valid", "test"], "--mode=eval: split to evaluate.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 for multi-host runs (see launch/).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in a multi-host run.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save step at INFO
  if _COORDINATOR.value:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  print(f"devices: {jax.devices()}", flush=True)
  if _MODE.value == "train":
    result = loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  else:
    result = loop.evaluate_checkpoint(_CONFIG.value, _WORKDIR.value, _STEP.value, _SPLIT.value)
  print(json.dumps(result, indent=2))


def run() -> None:
  try:
    app.run(main)
  except (ValueError, FileNotFoundError, FloatingPointError) as error:
    # Config, data and checkpoint errors carry their fix in the message; a traceback adds nothing.
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  run()

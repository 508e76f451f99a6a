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

from stablemoe_jax import cli
from stablemoe_jax.commands import analyze as analysis_command
from stablemoe_jax.commands import translate as translate_command
from stablemoe_jax.experiment import config_validation
from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment import plan as plan_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, tokenizer and data.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "analyze", "plan", "translate"],
                          "train (resumes if possible), eval a checkpoint, analyze its routing (DIR/analysis), "
                          "plan the memory of the config on --plan_devices accelerators, or translate --input "
                          "(translation configs).")
_PLAN_DEVICES = flags.DEFINE_integer("plan_devices", None, "--mode=plan: the number of accelerators to plan for.")
_PLAN_MEMORY = flags.DEFINE_float("plan_memory_gib", 80.0, "--mode=plan: memory of one accelerator, GiB.")
_STEP = flags.DEFINE_integer("step", None, "--mode=eval: checkpoint step to restore (default: latest).")
_SPLIT = flags.DEFINE_enum("split", "valid", ["valid", "test"], "--mode=eval: split to evaluate.")
_SRC_LANG = flags.DEFINE_string("src_lang", None, "--mode=translate: the input's language (e.g. de).")
_INPUT = flags.DEFINE_string("input", "-", "--mode=translate: one sentence a line (-: stdin).")
_OUTPUT = flags.DEFINE_string("output", "-", "--mode=translate: one translation a line (-: stdout).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-process run: call jax.distributed.initialize (it detects SLURM and "
    "Open MPI by itself; elsewhere give the three flags below). See launch/.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0 to num_processes - 1.")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", 10, "Multi-process: a process that has not been heard from for this long is "
    "taken as dead and every other process stops with an error (JAX's default is 100).")
_SHUTDOWN_TIMEOUT = flags.DEFINE_integer(
    "shutdown_timeout_seconds", 30, "Multi-process: how long a finishing process waits for the others at exit.")
_INIT_TIMEOUT = flags.DEFINE_integer(
    "initialization_timeout", 300, "Multi-process: seconds to wait for every process to join at start.")
_CPU_DEVICES = flags.DEFINE_integer(
    "cpu_devices", None, "Number of CPU devices this process gets (sets jax_num_cpu_devices before JAX starts), "
    "to try a mesh on a laptop; same as XLA_FLAGS=--xla_force_host_platform_device_count=N.")
flags.mark_flags_as_required(["config", "workdir"])
CHECKPOINT_MODES = ("eval", "analyze", "translate")  # the modes that read a checkpoint of --workdir


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save step at INFO
  if _CPU_DEVICES.value is not None:
    if _CPU_DEVICES.value < 1:
      raise app.UsageError(f"--cpu_devices={_CPU_DEVICES.value} must be a positive number of devices.")
    jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
  if _DISTRIBUTED.value or _COORDINATOR.value:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                               initialization_timeout=_INIT_TIMEOUT.value,
                               heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value,
                               shutdown_timeout_seconds=_SHUTDOWN_TIMEOUT.value)
  log = sys.stderr if _MODE.value == "translate" else sys.stdout  # translate's stdout is the translations
  if jax.process_index() == 0:
    print(f"{jax.process_count()} process(es), devices: {jax.devices()}", file=log, flush=True)
  if _MODE.value in CHECKPOINT_MODES:  # no checkpoint to read: one line, before anything is built or written
    loop.require_checkpoint(_WORKDIR.value, _STEP.value)
  if _MODE.value != "plan":  # a corpus only `stablemoe_jax.prepare` prepares: one line naming it with this --config
    config_validation.check_prepared(_CONFIG.value, _WORKDIR.value,
                                     config_flags.get_config_filename(flags.FLAGS["config"]))
  if _MODE.value == "plan":
    plan_lib.check_plan_flags(_PLAN_DEVICES.value, _PLAN_MEMORY.value)
    result = plan_lib.plan(_CONFIG.value, _PLAN_DEVICES.value, _PLAN_MEMORY.value)
    print(plan_lib.format_plan(result))
  elif _MODE.value == "train":
    result = loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value).to_json()
  elif _MODE.value == "analyze":
    result = analysis_command.analyze_checkpoint(_CONFIG.value, _WORKDIR.value, _STEP.value, _SPLIT.value)
  elif _MODE.value == "translate":
    if not _SRC_LANG.value:
      raise app.UsageError("--mode=translate needs --src_lang (e.g. --src_lang=de).")
    result = translate_command.translate_file(_CONFIG.value, _WORKDIR.value, _STEP.value, _SRC_LANG.value,
                                              _INPUT.value, _OUTPUT.value)
  else:
    result = loop.evaluate_checkpoint(_CONFIG.value, _WORKDIR.value, _STEP.value, _SPLIT.value)
  if jax.process_index() == 0:
    print(json.dumps(result, indent=2), file=log)


def run() -> None:
  cli.run_app(main)


if __name__ == "__main__":
  run()

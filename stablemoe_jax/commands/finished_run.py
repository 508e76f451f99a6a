"""What the analysis commands on a finished run share (``declined``, ``bias_share``): the RUN_DIR argument, the
run's experiment restored at a checkpoint, and the result written beside the run's other analysis files."""
from __future__ import annotations

import argparse
import json
import pathlib
from typing import Callable

import ml_collections

from stablemoe_jax.core.run_view import RunView
from stablemoe_jax.experiment import loop


def parser_for(doc: str, batches: str) -> argparse.ArgumentParser:
  """A command's parser with RUN_DIR, ``--batches`` (what a batch is: ``batches``), ``--split`` and ``--step``; its
  description is ``doc``'s first paragraph."""
  parser = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
  parser.add_argument("run_dir", type=pathlib.Path, help="a training workdir (config.json and checkpoints)")
  parser.add_argument("--batches", type=int, default=20, help=f"{batches} to route (<= 0: all)")
  parser.add_argument("--split", default="valid", choices=("valid", "test"))
  parser.add_argument("--step", type=int, default=None, help="the checkpoint to restore (default: the latest)")
  return parser


def analyse_checkpoint(parser: argparse.ArgumentParser, args: argparse.Namespace, name: str,
                       measure: Callable[[RunView, dict], dict]) -> tuple[dict, pathlib.Path]:
  """Restores ``args.run_dir``'s checkpoint at ``args.step`` (None: the latest), measures it with
  ``measure(run, params) -> {layer: ...}`` (``run``: the run's ``RunView``) and writes ``{"step", "split", "layers"}`` to
  ``RUN_DIR/analysis/{name}_{split}_step{N}.json``; (result, its path). A folder that is not a run, or a missing
  checkpoint, is a parser error (exit 2)."""
  config_path = args.run_dir / "config.json"
  if not config_path.is_file():
    parser.error(f"{config_path} not found: RUN_DIR must be the workdir of a training run "
                 f"(python -m stablemoe_jax.main --workdir RUN_DIR writes config.json there).")
  config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
  try:
    loop.require_checkpoint(args.run_dir, args.step)
  except FileNotFoundError as error:
    parser.error(str(error))
  exp = loop.Experiment(config, args.run_dir)
  try:
    step, state = exp.restore_for_evaluation(args.step)
    result = {"step": step, "split": args.split, "layers": measure(exp.view(), state.params)}
  finally:
    exp.checkpointer.close()
  out = args.run_dir / "analysis" / f"{name}_{args.split}_step{step}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=2))
  return result, out


def percent(value) -> str:
  return "--" if value is None else f"{value:.1%}"

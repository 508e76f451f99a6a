"""Splits a finished run's declined tokens (gate < 0.01) into forced and own-choice ones (analysis/declined.py).

    python -m stablemoe_jax.commands.declined RUN_DIR [--batches 20] [--split valid]

RUN_DIR is a training workdir (its ``config.json`` and checkpoints; a comparison's or sweep's run directory too).
Prints one line per MoE layer and writes ``RUN_DIR/analysis/declined_{split}_step{N}.json``.
"""
from __future__ import annotations

import argparse
import json
import pathlib

import ml_collections

from stablemoe_jax.analysis.declined import declined_tokens
from stablemoe_jax.experiment import loop
from stablemoe_jax.models.routing import LOW_GATE


def _percent(value) -> str:
  return "--" if value is None else f"{value:.1%}"


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("run_dir", type=pathlib.Path, help="a training workdir (config.json and checkpoints)")
  parser.add_argument("--batches", type=int, default=20, help="batches of the training shape to route (<= 0: all)")
  parser.add_argument("--split", default="valid", choices=("valid", "test"))
  args = parser.parse_args(argv)
  config_path = args.run_dir / "config.json"
  if not config_path.is_file():
    parser.error(f"{config_path} not found: RUN_DIR must be the workdir of a training run "
                 f"(python -m stablemoe_jax.main --workdir RUN_DIR writes config.json there).")
  config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
  exp = loop.Experiment(config, args.run_dir)
  try:
    step, state = exp.restore_for_evaluation(None)
    result = {"step": step, "split": args.split, "layers": declined_tokens(exp, state.params, args.split, args.batches)}
  finally:
    exp.checkpointer.close()
  out = args.run_dir / "analysis" / f"declined_{args.split}_step{step}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=2))
  for layer, s in result["layers"].items():
    print(f"{layer}: {s['tokens']} tokens; forced off the inference expert {_percent(s['forced_fraction'])}; "
          f"gates < {LOW_GATE}: {_percent(s['low_gate_fraction'])}, of which forced "
          f"{_percent(s['forced_share_of_low_gates'])}; among forced tokens {_percent(s['low_gate_fraction_forced'])}"
          f", among own-choice tokens {_percent(s['low_gate_fraction_own'])}")
  print(f"wrote {out}")
  return result


if __name__ == "__main__":
  main()

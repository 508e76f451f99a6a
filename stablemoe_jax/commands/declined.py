"""Splits a finished run's declined tokens (gate < 0.01) into forced and own-choice ones (analysis/declined.py).

    python -m stablemoe_jax.commands.declined RUN_DIR [--batches 20] [--split valid] [--step N]

RUN_DIR is a training workdir (its ``config.json`` and checkpoints; a comparison's or sweep's run directory too).
Prints one line per MoE layer and writes ``RUN_DIR/analysis/declined_{split}_step{N}.json``.
"""
from __future__ import annotations

from stablemoe_jax.analysis.declined import declined_tokens
from stablemoe_jax.commands.finished_run import analyse_checkpoint, parser_for, percent
from stablemoe_jax.models.routing import LOW_GATE


def main(argv: list[str] | None = None) -> dict:
  parser = parser_for(__doc__, "batches of the training shape")
  args = parser.parse_args(argv)
  result, out = analyse_checkpoint(parser, args, "declined",
                                   lambda run, params: declined_tokens(run, params, args.split, args.batches))
  for layer, s in result["layers"].items():
    print(f"{layer}: {s['tokens']} tokens; forced off the inference expert {percent(s['forced_fraction'])}; "
          f"gates < {LOW_GATE}: {percent(s['low_gate_fraction'])}, of which forced "
          f"{percent(s['forced_share_of_low_gates'])}; among forced tokens {percent(s['low_gate_fraction_forced'])}"
          f", among own-choice tokens {percent(s['low_gate_fraction_own'])}")
  print(f"wrote {out}")
  return result


if __name__ == "__main__":
  main()

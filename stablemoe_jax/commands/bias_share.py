"""How much of a finished bias-balanced run's routing its balancing bias decides (analysis/bias_share.py).

    python -m stablemoe_jax.commands.bias_share RUN_DIR [--batches 20] [--split valid] [--step N]

RUN_DIR is the workdir of a run whose router has a bias (``--config.model.moe.router=deepseek``; a comparison's or
sweep's run directory too). Routes the split's first batches with the inference routing as trained and with every
bias at 0; prints, per MoE layer, the share of real tokens whose first expert and whose set of k experts the bias
changes, and writes ``RUN_DIR/analysis/bias_share_{split}_step{N}.json``.
"""
from __future__ import annotations

from stablemoe_jax.analysis.bias_share import bias_overridden_tokens
from stablemoe_jax.commands.finished_run import analyse_checkpoint, parser_for, percent


def main(argv: list[str] | None = None) -> dict:
  parser = parser_for(__doc__, "evaluation batches")
  args = parser.parse_args(argv)

  def measure(run, params):
    try:
      return bias_overridden_tokens(run, params, args.split, args.batches)
    except ValueError as error:  # a run without a bias: a wrong RUN_DIR, said as a usage error
      parser.error(str(error))

  result, out = analyse_checkpoint(parser, args, "bias_share", measure)
  for layer, s in result["layers"].items():
    print(f"{layer}: {s['tokens']} tokens; the bias changes the first expert of {percent(s['first_changed_fraction'])}"
          f" and the set of experts of {percent(s['set_changed_fraction'])}; bias spread {s['bias_spread']:.3f}")
  print(f"wrote {out}")
  return result


if __name__ == "__main__":
  main()

"""Fluctuation curves of several runs on one chart (the paper's Figures 2 and 8).

``python -m stablemoe_jax.analysis.plot RUN_DIR [RUN_DIR ...] --out fluctuation.png [--labels a,b] [--routing train]``
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from stablemoe_jax.analysis import fluctuation
from stablemoe_jax.analysis.records import ROUTINGS, RecordsNotFoundError, load_records

Curve = tuple[str, np.ndarray, np.ndarray]


def pyplot():
  """matplotlib.pyplot with the file-only backend, imported when a figure is drawn: at the top, its import cost
  every process that loads the training loop 1.5 s (shared cores)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def plot_curves(curves: list[Curve], out: str | pathlib.Path, title: str = "") -> list[str]:
  """Draws ``(label, x % of training [K], cumulative token share [K])`` curves as steps into the PNG ``out``;
  returns the labels of the curves drawn."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
  for label, x, y in curves:
    ax.step(x, 100.0 * np.asarray(y), where="post", label=label, linewidth=1.8)
  ax.set_xlabel("last fluctuation step (% of training)")
  ax.set_ylabel("cumulative token percentage (%)")
  ax.set_xlim(0, 100)
  ax.set_ylim(0, 101)
  ax.grid(alpha=0.3)
  # Below the axes: inside, the legend would hide the curves of a many-method comparison.
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, frameon=False)
  if title:
    ax.set_title(title)
  fig.tight_layout()
  pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, bbox_inches="tight")
  drawn = [line.get_label() for line in ax.get_lines()]
  plt.close(fig)
  return drawn


def run_curves(run_dirs: list[str], labels: list[str], routing: str) -> list[Curve]:
  return [(label, *fluctuation.curve_from_records(load_records(d), routing)) for d, label in zip(run_dirs, labels)]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("run_dirs", nargs="+", help="run workdirs (each with a routing/ folder of records)")
  parser.add_argument("--out", required=True, help="the PNG to write")
  parser.add_argument("--labels", default="", help="comma-separated curve labels (default: the run dirs' names)")
  parser.add_argument("--routing", choices=ROUTINGS, default="train",
                      help="train: the routing training used at each record (default); inference: the eval routing")
  args = parser.parse_args(argv)
  labels = args.labels.split(",") if args.labels else [pathlib.Path(d).resolve().name for d in args.run_dirs]
  if len(labels) != len(args.run_dirs):
    print(f"error: --labels has {len(labels)} labels for {len(args.run_dirs)} run dirs; give one per run.",
          file=sys.stderr)
    return 2
  try:
    curves = run_curves(args.run_dirs, labels, args.routing)
  except RecordsNotFoundError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  drawn = plot_curves(curves, args.out, title=f"routing fluctuation ({args.routing} routing)")
  print(f"wrote {args.out}: {len(drawn)} curve(s): {', '.join(drawn)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

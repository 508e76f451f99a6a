"""The facts regime's capacity curve (issue 73): final recall against the number of facts, one line per model.

    python -m stablemoe_jax.compare.facts_curve RUNS_DIR [--out DIR]

RUNS_DIR holds one folder per run named ``<method>_a<attributes>`` (a method of compare/methods.py, or ``wider`` for
``dense_wider``; ``results/facts_cpu/calibration``: ``dense_a8``, ``stablemoe_a16``, ...), each with the
``summary.json`` of a facts run (``data.corpus=facts``). Writes
``capacity_curve.{json,md,png}`` to DIR (RUNS_DIR by default): recall and value NLL per model and corpus size, and
for the learned routers P(forget | route changed) / P(forget | route kept) at each size. Where the dense model's
recall falls and the wider one's does not is the regime the MoEs are compared in.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re

from stablemoe_jax.analysis import plot
from stablemoe_jax.compare.facts_cells import share_cell, value_experts
from stablemoe_jax.compare.methods import METHODS
from stablemoe_jax.core.summary import RunSummary

# A run folder's model is a comparison method (compare/methods.py: its label names the row); "wider" is the folder
# prefix of the dense model of the MoE's total parameters.
ALIASES = {"wider": "dense_wider"}
RUN_NAME = re.compile(r"(?P<model>[a-z0-9_]+?)_a(?P<attributes>\d+)")  # method names hold underscores


def curve_points(runs_dir: pathlib.Path) -> dict[str, list[dict]]:
  """{method: [point, ...] by number of facts}, methods in compare/methods.py's order; a point: lines (facts at one
  phrasing each), recall, value_nll, p_forget_changed, p_forget_kept (None: no route changed), routed (the run has an
  MoE layer), train_seconds, run (the folder's name)."""
  points: dict[str, list[dict]] = {}
  for run in sorted(runs_dir.iterdir()):
    match = RUN_NAME.fullmatch(run.name)
    method = match and ALIASES.get(match["model"], match["model"])
    if not (method in METHODS and (run / "summary.json").is_file()):  # not a run of the curve
      continue
    summary = RunSummary.load(run / "summary.json")
    facts = summary.facts
    points.setdefault(method, []).append({
        "run": run.name, "lines": facts["lines"], "recall": facts["final"]["facts/recall"],
        "value_nll": facts["final"]["facts/value_nll"],
        "p_forget_changed": facts["forgetting"]["p_forget_changed"],
        "p_forget_kept": facts["forgetting"]["p_forget_kept"],
        "routed": bool(value_experts(facts["final"])),
        "train_seconds": summary.train_seconds})
  if not points:
    raise ValueError(f"{runs_dir} holds no facts run named <method>_a<attributes> (a method of "
                     f"compare/methods.py, or wider) with a summary.json")
  return {method: sorted(points[method], key=lambda p: p["lines"]) for method in METHODS if method in points}


def _sizes(points: dict[str, list[dict]]) -> list[int]:
  """Every corpus size (facts) of any model's points, ascending."""
  return sorted({p["lines"] for model in points.values() for p in model})


def _table(points: dict[str, list[dict]], cell) -> list[str]:
  """A markdown table: a row per model, a column per corpus size, ``cell(point)`` where the model has one."""
  sizes = _sizes(points)
  lines = ["| model | " + " | ".join(f"{size:,} facts" for size in sizes) + " |",
           "|---|" + "---|" * len(sizes)]
  for model, model_points in points.items():
    by_size = {p["lines"]: p for p in model_points}
    cells = [cell(by_size[size]) if size in by_size else "" for size in sizes]
    lines.append(f"| {METHODS[model].label} | " + " | ".join(cells) + " |")
  return lines


def markdown(points: dict[str, list[dict]]) -> str:
  """The curve's tables: recall (value NLL), and forgetting by route change for the routed models."""
  routed = {m: p for m, p in points.items() if any(q["routed"] for q in p)}
  text = ["# Capacity curve: recall against the number of facts", "",
          "Final recall (greedy, every fact) and the value tokens' NLL, one seed per point:", "",
          *_table(points, lambda p: f"{p['recall']:.1%} ({p['value_nll']:.3f})"), "",
          "P(forget | route changed) / P(forget | route kept) over the run's evaluation points:", "",
          *_table(routed, lambda p: f"{share_cell(p['p_forget_changed'])} / {share_cell(p['p_forget_kept'])}"), "",
          "Training seconds (the machine's load varied; not a speed measurement):", "",
          *_table(points, lambda p: f"{p['train_seconds']:,.0f}"), ""]
  return "\n".join(text)


def write_plot(points: dict[str, list[dict]], path: pathlib.Path) -> None:
  """Recall against facts (log x), one line per model."""
  plt = plot.pyplot()
  figure, axes = plt.subplots(figsize=(6.5, 4.2))
  for model, model_points in points.items():
    axes.plot([p["lines"] for p in model_points], [100 * p["recall"] for p in model_points], marker="o",
              label=METHODS[model].label)
  axes.set_xscale("log", base=2)
  sizes = _sizes(points)
  axes.set_xticks(sizes, [f"{size:,}" for size in sizes])
  axes.set_xlabel("facts in the corpus (same steps for every size)")
  axes.set_ylabel("facts recalled at the end (%)")
  axes.set_ylim(0, 102)
  axes.grid(True, alpha=0.3)
  axes.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def write_curve(runs_dir: pathlib.Path, out_dir: pathlib.Path) -> dict[str, list[dict]]:
  """capacity_curve.json, .md and .png in ``out_dir``; returns the points."""
  points = curve_points(runs_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "capacity_curve.json").write_text(json.dumps(points, indent=1) + "\n")
  (out_dir / "capacity_curve.md").write_text(markdown(points))
  write_plot(points, out_dir / "capacity_curve.png")
  return points


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("runs_dir", type=pathlib.Path, help="the folder of <model>_a<attributes> runs")
  parser.add_argument("--out", type=pathlib.Path, default=None, help="where to write (default: RUNS_DIR)")
  args = parser.parse_args(argv)
  if not args.runs_dir.is_dir():
    parser.error(f"{args.runs_dir} is not a folder; give the folder of the facts runs, e.g. "
                 f"results/facts_cpu/calibration")
  try:
    points = write_curve(args.runs_dir, args.out or args.runs_dir)
  except ValueError as error:
    parser.error(str(error))
  print(markdown(points))


if __name__ == "__main__":
  main()

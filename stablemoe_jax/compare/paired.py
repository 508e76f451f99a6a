"""Paired differences against a baseline method: each method's run minus the baseline's run of the same seed (the
same initialisation seed and data order), their mean and its 95% Student-t interval.

With three seeds the interval is wide (t_{0.975, 2} = 4.30): a difference is "supported" only when the interval
excludes 0, and the plain-words ranking of the README says no more than that.
"""
from __future__ import annotations

import math

import numpy as np

METRICS = ("valid", "test")  # perplexity of each split, as summary.json has it


def t_quantile(degrees_of_freedom: int, level: float = 0.95) -> float:
  """The two-sided Student-t quantile t_{(1 + level) / 2, dof} (scipy, imported here: it costs ~1 s at start-up)."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  return float(stats.t.ppf((1.0 + level) / 2.0, degrees_of_freedom))


def interval(differences: list[float], level: float = 0.95) -> dict:
  """``{"n", "mean", "low", "high"}`` of paired differences; ``low``/``high`` None with fewer than 2 pairs."""
  values = np.asarray(differences, dtype=np.float64)
  n = len(values)
  if n == 0:
    return {"n": 0, "mean": None, "low": None, "high": None}
  mean = float(values.mean())
  if n < 2:
    return {"n": 1, "mean": mean, "low": None, "high": None}
  half = t_quantile(n - 1, level) * float(values.std(ddof=1)) / math.sqrt(n)
  return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def reading(result: dict) -> str:
  """What the interval supports, in words: lower / higher than the baseline, or not distinguishable."""
  if result["low"] is None:
    return "too few paired seeds"
  if result["high"] < 0:
    return "lower"
  if result["low"] > 0:
    return "higher"
  return "not distinguishable"


def paired_differences(records: list[dict], baseline: str = "dense") -> dict[str, dict]:
  """For every method but ``baseline``: per metric, the paired differences (method - baseline) of perplexity over
  the seeds both have, and their interval.

  Args:
    records: run records (``runner.run_record``): "method", "seed", "summary".
    baseline: the method every other is paired with.

  Returns:
    ``{method: {"seeds": [...], "valid": {"differences", "n", "mean", "low", "high", "reading"}, "test": {...}}}``;
    {} when the baseline has no run.
  """
  base = {r["seed"]: r["summary"] for r in records if r["method"] == baseline}
  if not base:
    return {}
  methods = list(dict.fromkeys(r["method"] for r in records if r["method"] != baseline))
  result = {}
  for method in methods:
    runs = {r["seed"]: r["summary"] for r in records if r["method"] == method}
    seeds = sorted(set(runs) & set(base))
    entry = {"seeds": seeds}
    for metric in METRICS:
      differences = [runs[s][metric]["perplexity"] - base[s][metric]["perplexity"] for s in seeds]
      stats = interval(differences)
      entry[metric] = {"differences": differences, **stats, "reading": reading(stats)}
    result[method] = entry
  return result


def _cell(stats: dict) -> str:
  if stats["mean"] is None:
    return "--"
  if stats["low"] is None:
    return f"{stats['mean']:+.2f}"
  return f"{stats['mean']:+.2f} [{stats['low']:+.2f}, {stats['high']:+.2f}]"


def markdown(paired: dict[str, dict], labels: dict[str, str], baseline_label: str = "dense") -> str:
  """The paired table: per method, seeds, valid and test PPL difference to the baseline with 95% intervals."""
  if not paired:
    return ""
  lines = [f"| method | paired seeds | valid PPL - {baseline_label} [95% CI] | test PPL - {baseline_label} [95% CI] "
           f"| test PPL against {baseline_label} |", "|---|---|---|---|---|"]
  for method, entry in paired.items():
    lines.append(f"| {labels.get(method, method)} | {', '.join(str(s) for s in entry['seeds']) or '--'} | "
                 f"{_cell(entry['valid'])} | {_cell(entry['test'])} | {entry['test']['reading']} |")
  return "\n".join(lines) + "\n"

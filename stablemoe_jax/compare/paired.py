"""Paired differences against a baseline method: each method's run minus the baseline's run of the same seed (the
same initialisation seed and data order), their mean and its 95% Student-t interval.

With three seeds the interval is wide (t_{0.975, 2} = 4.30): a difference is "supported" only when the interval
excludes 0, and the plain-words ranking of the README says no more than that.
"""
from __future__ import annotations

import collections
import math

import numpy as np

from stablemoe_jax.experiment.config_validation import ConfigError

METRICS = ("valid", "test", "train_loss")  # perplexity of each split, as summary.json has it; the training loss
# Translation runs (summary.json has "bleu") are also paired on the measures the paper's Table 4 reports.
TRANSLATION_METRICS = ("valid_nll", "bleu")
# Runs with named held-out sets (summary.json "sets", ``data.eval_sets``) are paired on each set's valid perplexity.
SET_PREFIX = "set/"


def metric_value(record: dict, metric: str) -> float | None:
  """A run's ``metric``: "valid" / "test" perplexity, "valid_nll" (validation NLL per target token), "bleu" (the
  average test BLEU over the pairs), "train_loss" (``runner.training_loss``; None for a record without it),
  "set/NAME" (the named held-out set NAME's validation perplexity)."""
  summary = record["summary"]
  if metric.startswith(SET_PREFIX):  # a named held-out set's validation perplexity
    return summary.sets[metric[len(SET_PREFIX):]]["valid"]["perplexity"]
  if metric == "train_loss":
    return record.get("train_loss")
  if metric == "valid_nll":
    return summary.valid["loss"]
  if metric == "bleu":
    return summary.bleu["average"]
  return getattr(summary, metric)["perplexity"]


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


def paired_differences(records: list[dict], baseline: str = "dense",
                       pairs: dict[str, str] | None = None) -> dict[str, dict]:
  """Per metric, the paired differences (method - its baseline) of perplexity over the seeds both have, and their
  interval.

  Args:
    records: run records (``runner.run_record``): "method", "seed", "summary", "train_loss".
    baseline: the method every other is paired with, when ``pairs`` is None.
    pairs: ``{method: its baseline}`` (an ablation against the method it ablates) instead.

  Returns:
    ``{method: {"baseline", "seeds": [...], "valid": {"differences", "n", "mean", "low", "high", "reading"},
    "test": {...}, "train_loss": {...}}}`` ("train_loss" has no differences when a run of the pair has no training
    loss), "valid_nll" and "bleu" when every run of the pair reports BLEU (translation), "set/NAME" for each named
    held-out set when every run of the pair scored them; a method whose baseline has no run is left out.
  """
  by_method: dict[str, dict] = {}
  for r in records:
    by_method.setdefault(r["method"], {})[r["seed"]] = r
  if pairs is None:
    pairs = {method: baseline for method in by_method if method != baseline}
  result = {}
  for method, against in pairs.items():
    runs, base = by_method.get(method, {}), by_method.get(against, {})
    if not base or not runs:
      continue
    seeds = sorted(set(runs) & set(base))
    entry = {"baseline": against, "seeds": seeds}
    translation = seeds and all(runs[s]["summary"].bleu is not None and base[s]["summary"].bleu is not None for s in seeds)
    sets = [f"{SET_PREFIX}{name}" for name in runs[seeds[0]]["summary"].sets or {}] if seeds else []
    if not all(runs[s]["summary"].sets and base[s]["summary"].sets for s in seeds):
      sets = []
    for metric in METRICS + (TRANSLATION_METRICS if translation else ()) + tuple(sets):
      values = [(metric_value(runs[s], metric), metric_value(base[s], metric)) for s in seeds]
      recorded = all(run is not None and against is not None for run, against in values)
      differences = [run - against for run, against in values] if recorded else []
      stats = interval(differences)
      entry[metric] = {"differences": differences, **stats, "reading": reading(stats)}
    result[method] = entry
  return result


def parse_pairs(text: str, methods: list[str], key: str = "compare.pairs") -> dict[str, str]:
  """``compare.pairs`` "ABLATION:BASELINE,..." -> {ablation: baseline}; both must be compared methods, and each
  ablation has one baseline."""
  pairs = parse_contrasts(text, methods, key)
  twice = sorted(method for method, count in collections.Counter(m for m, _ in pairs).items() if count > 1)
  if twice:
    raise ConfigError(f"{key}={text!r}: {', '.join(twice)} named on the left more than once; a method is paired "
                      f"with one baseline (use compare.contrasts for more).")
  return dict(pairs)


def parse_contrasts(text: str, methods: list[str], key: str = "compare.contrasts") -> list[tuple[str, str]]:
  """``key`` "A:B,..." -> [(A, B), ...] in order; both of each must be compared methods, two different ones, and no
  contrast is named twice."""
  contrasts = []
  for item in str(text or "").split(","):
    if not item.strip():
      continue
    method, sep, against = (part.strip() for part in item.partition(":"))
    if not sep or method not in methods or against not in methods:
      raise ConfigError(f"{key}={text!r}: {item.strip()!r} must be METHOD:BASELINE with both in "
                       f"compare.methods={methods}, e.g. --config.{key}=base_fixed:base.")
    if method == against or (method, against) in contrasts:
      raise ConfigError(f"{key}={text!r}: {item.strip()!r} " + ("compares a method with itself" if method == against
                        else "is named twice") + "; name each contrast of two different methods once.")
    contrasts.append((method, against))
  return contrasts


def contrast_differences(records: list[dict], contrasts: list[tuple[str, str]]) -> list[tuple[str, dict]]:
  """Each contrast (A, B) as ``(A, paired_differences entry of A against B)``, in order; a contrast one of whose
  methods has no run is left out."""
  entries = []
  for method, against in contrasts:
    entry = paired_differences(records, pairs={method: against}).get(method)
    if entry is not None:
      entries.append((method, entry))
  return entries


def _cell(stats: dict, digits: int = 2) -> str:
  if stats["mean"] is None:
    return "--"
  if stats["low"] is None:
    return f"{stats['mean']:+.{digits}f}"
  return f"{stats['mean']:+.{digits}f} [{stats['low']:+.{digits}f}, {stats['high']:+.{digits}f}]"


# (header, cell of a method's paired entry) after the method, its baseline and the paired seeds.
_TRAIN_LOSS_COLUMN = ("train loss difference [95% CI]", lambda e: _cell(e["train_loss"], 3))
_LM_COLUMNS = (("valid PPL difference [95% CI]", lambda e: _cell(e["valid"])),
               ("test PPL difference [95% CI]", lambda e: _cell(e["test"])),
               ("test PPL", lambda e: e["test"]["reading"]),
               _TRAIN_LOSS_COLUMN)
_TRANSLATION_COLUMNS = (_TRAIN_LOSS_COLUMN,
                        ("valid NLL difference [95% CI]", lambda e: _cell(e["valid_nll"], 3)),
                        ("valid NLL", lambda e: e["valid_nll"]["reading"]),
                        ("average BLEU difference [95% CI]", lambda e: _cell(e["bleu"])),
                        ("BLEU", lambda e: e["bleu"]["reading"]))


def markdown(paired: dict[str, dict] | list[tuple[str, dict]], labels: dict[str, str]) -> str:
  """The paired table: per method (or contrast, ``contrast_differences``), its baseline, seeds, valid and test PPL
  difference with 95% intervals (for translation: validation NLL and average test BLEU)."""
  entries = list(paired.items()) if isinstance(paired, dict) else list(paired)
  if not entries:
    return ""
  columns = _TRANSLATION_COLUMNS if all("bleu" in entry for _, entry in entries) else _LM_COLUMNS
  lines = ["| method | against | paired seeds | " + " | ".join(header for header, _ in columns) + " |",
           "|---" * (3 + len(columns)) + "|"]
  for method, entry in entries:
    cells = [labels.get(method, method), labels.get(entry["baseline"], entry["baseline"]),
             ", ".join(str(s) for s in entry["seeds"]) or "--", *(cell(entry) for _, cell in columns)]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def sets_markdown(paired: dict[str, dict], labels: dict[str, str]) -> str:
  """Per method and named held-out set, the paired valid PPL difference with its 95% interval and reading; ""
  when no pair scored named sets."""
  entries = {method: entry for method, entry in paired.items() if any(k.startswith(SET_PREFIX) for k in entry)}
  if not entries:
    return ""
  names = [k[len(SET_PREFIX):] for k in next(iter(entries.values())) if k.startswith(SET_PREFIX)]
  lines = ["| method | against | paired seeds | " + " | ".join(f"{name} valid PPL difference" for name in names) + " |",
           "|---" * (3 + len(names)) + "|"]
  for method, entry in entries.items():
    cells = [f"{_cell(entry[SET_PREFIX + name])} ({entry[SET_PREFIX + name]['reading']})" for name in names]
    lines.append("| " + " | ".join([labels.get(method, method), labels.get(entry["baseline"], entry["baseline"]),
                                    ", ".join(str(s) for s in entry["seeds"]), *cells]) + " |")
  return "\n".join(lines) + "\n"

"""The routers-after-StableMoE stability table (docs/results.md, "Routers after StableMoE"; README's short one, "Does
routing keep changing?") says what the committed sweep measured: each row's choice, seeds, perplexities, paired
interval against dense, per-seed layer worth and the shares of tokens whose first expert, and whose set of k experts,
last changed after 20/50/80% of training, recomputed from ``results/tune_routers_cpu/comparison.json`` (the report of
``configs/tune_routers_cpu.py`` over the runs in ``results/tune_h100``). A row whose method has a dead layer in a
reported seed carries the report's DEAD LAYER mark, and only such a row."""
from __future__ import annotations

import json

from tests.compare.doc_tables import (check_report_is_committed_runs, check_rows_are_report, interval_cell,
                                      markdown_rows, spread_cell, typed_runs)
from tests.conftest import REPO

from stablemoe_jax.compare import paired
from stablemoe_jax.train.health import least_contribution

REPORT = REPO / "results" / "tune_routers_cpu" / "comparison.json"
HEADER = "| router (PTB, 850 steps) | chosen lr / warmup (seed 0) |"  # docs/results.md
SHORT_HEADER = "| router (PTB, 850 steps, seeds 1-3) | chosen lr / warmup (seed 0) |"  # README.md
MARK = " (DEAD LAYER)"
# The table's label of each method (the documents' words) -> the method's name in the sweep.
LABELS = {
    "dense Transformer": "dense",
    "StableMoE, cosine routing (the CPU default)": "stablemoe_cosine",
    "Switch Transformer (top-1)": "switch",
    "BASE Layer": "base",
    "Hash Layer": "hash",
    "Switch Transformer, top-2": "switch_top2",
    "DeepSeek-V3 bias-balanced sigmoid, top-2": "deepseek",
    "DeepSeek-V3 bias-balanced sigmoid, top-2, one shared expert": "deepseek_shared",
}


def _shares(shares: dict | None) -> str:
  return " / ".join(f"{shares[f'after_{p}']:.1%}" for p in (20, 50, 80)) if shares else "--"


def choice_cell(choice: dict | None) -> str:
  if choice and choice.get("every_setting_diverged"):
    return "none: every setting diverged"
  return f"{choice['learning_rate']} / {choice['warmup_steps']}" if choice else "grid not finished"


def expected_cells(report: dict, method: str) -> list[str]:
  """The row the committed report gives ``method`` (every cell after the label)."""
  entry = next(e for e in report["methods"] if e["method"] == method)
  runs = sorted((run for run in report["runs"] if run["method"] == method), key=lambda run: run["seed"])
  against = paired.paired_differences(typed_runs(report)).get(method)
  test = against["test"] if against else None
  return [choice_cell(report["choices"][method]), ", ".join(str(run["seed"]) for run in runs),
          spread_cell(entry["valid_ppl_mean"], entry["valid_ppl_std"], 2, len(runs)),
          spread_cell(entry["test_ppl_mean"], entry["test_ppl_std"], 2, len(runs)),
          interval_cell(test, 2) if test else "--",
          ", ".join(f"{least_contribution(run['summary']['health']):+.1%}" for run in runs) if against else "--",
          _shares(entry["fluctuation"]),
          _shares(entry["fluctuation_k_set"]) if entry["top_k"] > 1 else "--"]


def test_cells_of_one_finished_seed_say_so_instead_of_a_zero_spread():
  assert spread_cell(155.871, 0.0, 2, 1) == "155.87 (one seed)"
  assert spread_cell(155.871, 0.25, 2, 2) == "155.87 ± 0.25"
  assert interval_cell({"n": 1, "mean": 1.274, "low": None, "high": None}, 2) == "+1.27 (one seed, no interval)"
  assert interval_cell({"n": 2, "mean": 1.274, "low": -0.5, "high": 3.0}, 2) == "+1.27 [-0.50, +3.00]"


def _unmarked(rows: dict[str, list[str]], report: dict, where: str) -> dict[str, list[str]]:
  """``rows`` with the DEAD LAYER mark taken off each label, after checking it is there exactly where the report
  finds a dead layer in a reported seed."""
  dead = {entry["method"] for entry in report["methods"] if (entry.get("health") or {}).get("dead")}
  result = {}
  for label, cells in rows.items():
    plain = label[:-len(MARK)] if label.endswith(MARK) else label
    assert (LABELS.get(plain) in dead) == label.endswith(MARK), f"{where}: {label!r} and the report's DEAD LAYER mark"
    result[plain] = cells
  return result


def test_stability_table_is_the_committed_report():
  report = json.loads(REPORT.read_text())
  rows = _unmarked(markdown_rows(REPO / "docs" / "results.md", HEADER), report, "docs/results.md")
  check_rows_are_report(rows, LABELS, report, expected_cells, choice_cell, "docs/results.md's stability table")


def short_cells(report: dict, method: str) -> list[str]:
  """README's short row: choice, first-expert shares, paired test interval, worth."""
  cells = expected_cells(report, method)
  return [cells[i] for i in (0, 6, 4, 5)]


def test_readmes_short_stability_table_is_the_committed_report():
  report = json.loads(REPORT.read_text())
  rows = _unmarked(markdown_rows(REPO / "README.md", SHORT_HEADER), report, "README.md")
  labels = {label: method for label, method in LABELS.items() if method != "dense"}
  check_rows_are_report(rows, labels, report, short_cells, choice_cell, "README's stability table")


def test_stability_report_is_the_committed_runs():
  """Every run the report reads is committed, with the summary the report quotes."""
  check_report_is_committed_runs(json.loads(REPORT.read_text()), REPO, ("valid", "test"))

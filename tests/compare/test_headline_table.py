"""The headline table ("Language model: each method at its best" in docs/results.md, the same table in
docs/tuning.md) says what the committed sweep measured: each row's choice, seeds, valid and test perplexity, paired
interval against dense and per-seed layer worth are recomputed here from ``results/tune_h100/comparison.json`` (the
runs' own summaries), and a method whose seeds are in the report cannot stay marked as not finished. README's short
table ("Does any router beat dense?": choice, test perplexity, paired interval, worth) is recomputed the same way.
"""
from __future__ import annotations

import json
import pathlib

import pytest
from tests.compare.doc_tables import markdown_rows, typed_runs
from tests.conftest import REPO

from stablemoe_jax.compare import paired
from stablemoe_jax.train.health import least_contribution

REPORT = REPO / "results" / "tune_h100" / "comparison.json"
# The table's label of each method (the README's words) -> the method's name in the sweep.
LABELS = {
    "dense Transformer (same shared layers)": "dense",
    "StableMoE, cosine routing (X-MoE; the CPU default)": "stablemoe_cosine",
    "Switch Transformer": "switch",
    "BASE Layer": "base",
    "Hash Layer": "hash",
    "StableMoE, `balance_scope=all`, dot routing": "stablemoe_all",
    "StableMoE, the paper's loss (`assigned`), dot routing": "stablemoe_assigned",
    "Switch Transformer, cosine routing (X-MoE)": "switch_cosine",
}
HEADER = "| method | chosen lr / warmup (seed 0) | reported seeds |"
SHORT_HEADER = "| method (PTB, 850 steps, seeds 1-3) | chosen lr / warmup (seed 0) |"  # README.md


def table_rows(path: pathlib.Path, header: str = HEADER) -> dict[str, list[str]]:
  """``{method name: its row's cells after the label}`` of the first table whose header starts with ``header``."""
  rows = {}
  for label, cells in markdown_rows(path, header).items():
    assert label in LABELS, f"{path.name}: a headline row this test does not know: {label!r}"
    rows[LABELS[label]] = cells
  return rows


def choice_cell(choice: dict | None) -> str:
  """The table's words for a method's choice in the report (None: its grid is not finished)."""
  return f"{choice['learning_rate']} / {choice['warmup_steps']}" if choice else "grid not finished"


def names_choice(cell: str, chosen: str) -> bool:
  """Whether a table's choice cell is ``chosen``, alone or with a bracketed note ("0.002 / 400 (two choices
  rejected)")."""
  return cell == chosen or cell.startswith(f"{chosen} (")


def expected_cells(report: dict, method: str) -> list[str]:
  """The row the committed report gives ``method``: choice, seeds, valid, test, paired test difference, worth."""
  summary = next(entry for entry in report["methods"] if entry["method"] == method)
  runs = sorted((run for run in report["runs"] if run["method"] == method), key=lambda run: run["seed"])
  differences = worth = "--"
  if method != "dense":
    test = paired.paired_differences(typed_runs(report))[method]["test"]
    differences = f"{test['mean']:+.2f} [{test['low']:+.2f}, {test['high']:+.2f}]"
    worth = ", ".join(f"{least_contribution(run['summary']['health']):+.2%}" for run in runs)
  return [choice_cell(report["choices"][method]), ", ".join(str(run["seed"]) for run in runs),
          f"{summary['valid_ppl_mean']:.2f} ± {summary['valid_ppl_std']:.2f}",
          f"{summary['test_ppl_mean']:.2f} ± {summary['test_ppl_std']:.2f}", differences, worth]


@pytest.mark.parametrize("document", ["docs/results.md", "docs/tuning.md"])
def test_headline_table_is_the_committed_report(document):
  report = json.loads(REPORT.read_text())
  rows = table_rows(REPO / document)
  reported = {entry["method"] for entry in report["methods"] if entry["seeds"]}
  assert reported <= set(rows), f"{document}: methods with reported seeds but no row: {reported - set(rows)}"
  for method, cells in rows.items():
    if method not in reported:
      chosen = choice_cell(report["choices"].get(method))
      assert names_choice(cells[0], chosen), f"{document}: {method}'s choice is {chosen!r} in {REPORT.name}"
      assert cells[2] == "--", f"{document}: {method} has numbers but no reported seeds in {REPORT.name}"
      continue
    expected = expected_cells(report, method)
    assert names_choice(cells[0], expected[0]), (
        f"{document}: {method}'s choice is {expected[0]!r} in {REPORT.name}, the table says {cells[0]!r}")
    assert cells[1:] == expected[1:], f"{document}: the {method} row differs from {REPORT.relative_to(REPO)}"


def test_readmes_short_table_is_the_committed_report():
  """README's short table: the tuned top-1 methods' choice, test perplexity, paired interval against dense and worth,
  each the report's (the full table's columns 0, 3, 4, 5)."""
  report = json.loads(REPORT.read_text())
  rows = table_rows(REPO / "README.md", SHORT_HEADER)
  assert set(rows) == {"dense", "stablemoe_cosine", "switch", "base", "hash"}, sorted(rows)
  for method, cells in rows.items():
    expected = [expected_cells(report, method)[i] for i in (0, 3, 4, 5)]
    assert names_choice(cells[0], expected[0]) and cells[1:] == expected[1:], f"README's {method} row: {cells}"

"""docs/facts.md's tables of single runs are the committed runs: each row's recall, value NLL and forgetting
recomputed from ``results/facts_cpu/<folder>/<run>/summary.json`` (the calibration, the stage-1 lengths, DeepSeek),
and each run's recall curve from its ``metrics.jsonl``. (README's capacity curve: tests/compare/test_facts_curve.py.)"""
from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO

RESULTS = REPO / "results" / "facts_cpu" / "calibration"
# Every folder of single facts runs the documents cite by the run's folder name.
RUN_FOLDERS = [RESULTS, REPO / "results" / "facts_cpu" / "stage1_length", REPO / "results" / "facts_cpu" / "routers"]


def _share(value: float | None) -> str:
  return "--" if value is None else f"{value:.1%}"


def _run_folder(name: str):
  """The committed run folder called ``name`` (None if no folder of RUN_FOLDERS has it)."""
  return next((folder / name for folder in RUN_FOLDERS if (folder / name).is_dir()), None)


def _rows(path) -> list[list[str]]:
  """Rows of the tables whose first column names a committed run folder (`name`)."""
  rows = []
  for line in path.read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("| `") and _run_folder(cells[0].strip("`")):
      rows.append(cells)
  return rows


def test_every_row_is_its_committed_run():
  rows = _rows(REPO / "docs" / "facts.md")
  assert len(rows) >= 4, "docs/facts.md: the facts tables lost their rows"
  for cells in rows:
    run = _run_folder(cells[0].strip("`"))
    facts = json.loads((run / "summary.json").read_text())["facts"]
    final, forgetting = facts["final"], facts["forgetting"]
    assert cells[2] == f"{final['facts/recall']:.1%}", (document, run.name)
    assert cells[3] == f"{final['facts/value_nll']:.3f}", (document, run.name)
    assert cells[4] == f"{_share(forgetting['p_forget_changed'])} / {_share(forgetting['p_forget_kept'])}", run.name


def test_each_run_s_logged_recall_ends_at_its_summary():
  runs = sorted(p for folder in RUN_FOLDERS if folder.is_dir() for p in folder.iterdir() if p.is_dir())
  assert runs
  for run in runs:
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    recalls = [m["facts/recall"] for m in logged if "facts/recall" in m]
    facts = json.loads((run / "summary.json").read_text())["facts"]
    assert recalls == pytest.approx(facts["recall_curve"][:-1], abs=1e-5)  # every point but the final one is logged
    if run.parent == RESULTS:  # the capacity curve's folder: <model>_a<attributes> only
      assert re.fullmatch(r"(dense|wider|stablemoe|switch)_a\d+", run.name)

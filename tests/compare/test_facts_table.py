"""The README's facts-regime table and docs/facts.md's calibration table are the committed runs: each row's recall,
value NLL and forgetting recomputed from ``results/facts_cpu/calibration/<run>/summary.json``, and each run's recall
curve from its ``metrics.jsonl``."""
from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO

RESULTS = REPO / "results" / "facts_cpu" / "calibration"


def _share(value: float | None) -> str:
  return "--" if value is None else f"{value:.1%}"


def _rows(path) -> list[list[str]]:
  """Rows of the table whose first column names a run folder (`name`) under results/facts_cpu/calibration."""
  rows = []
  for line in path.read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("| `") and (RESULTS / cells[0].strip("`")).is_dir():
      rows.append(cells)
  return rows


@pytest.mark.parametrize("document", ["README.md", "docs/facts.md"])
def test_every_row_is_its_committed_run(document):
  rows = _rows(REPO / document)
  assert len(rows) >= 4, f"{document}: the facts table lost its rows"
  for cells in rows:
    run = RESULTS / cells[0].strip("`")
    facts = json.loads((run / "summary.json").read_text())["facts"]
    final, forgetting = facts["final"], facts["forgetting"]
    assert cells[2] == f"{final['facts/recall']:.1%}", (document, run.name)
    assert cells[3] == f"{final['facts/value_nll']:.3f}", (document, run.name)
    assert cells[4] == f"{_share(forgetting['p_forget_changed'])} / {_share(forgetting['p_forget_kept'])}", run.name


def test_each_run_s_logged_recall_ends_at_its_summary():
  runs = sorted(p for p in RESULTS.iterdir() if p.is_dir())
  assert runs
  for run in runs:
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    recalls = [m["facts/recall"] for m in logged if "facts/recall" in m]
    facts = json.loads((run / "summary.json").read_text())["facts"]
    assert recalls == pytest.approx(facts["recall_curve"][:-1], abs=1e-5)  # every point but the final one is logged
    assert re.fullmatch(r"(dense|wider|stablemoe|switch)_a\d+", run.name)

"""docs/facts.md's tables of single runs are the committed runs: each row's recall, value NLL and forgetting
recomputed from ``results/facts_cpu/<folder>/<run>/summary.json`` (the calibration, the stage-1 lengths, DeepSeek),
and each run's recall curve from its ``metrics.jsonl``. (README's capacity curve: tests/compare/test_facts_curve.py.)"""
from __future__ import annotations

import json
import re

import pytest

from stablemoe_jax.compare import paired
from tests.compare.doc_tables import interval_cell, markdown_rows
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


def test_the_stage1_length_table_is_its_committed_runs():
  """docs/facts.md's stage-1 length summary: each length's mean recall at the end and at 50% of training over seeds
  1-3, its paired difference from the 10% stage 1 (mean [95% Student-t interval], percentage points), and the
  forgetting counts summed over the seeds, from ``results/facts_cpu/stage1_length/stage1_<steps>_seed<k>``."""
  folder = REPO / "results" / "facts_cpu" / "stage1_length"

  def facts(steps: int) -> list[dict]:
    return [json.loads((folder / f"stage1_{steps}_seed{k}" / "summary.json").read_text())["facts"] for k in (1, 2, 3)]

  measures = {"end": lambda f: f["final"]["facts/recall"], "half": lambda f: f["recall_at"]["at_50"]}
  rows = markdown_rows(REPO / "docs" / "facts.md", "| stage 1 | recall at the end |")
  assert len(rows) == 3, rows
  for label, cells in rows.items():
    steps = int(re.search(r"\((\d[\d,]*) steps\)", label).group(1).replace(",", ""))
    runs, base = facts(steps), facts(500)
    for cell, measure in zip(cells, measures.values()):
      mean = f"{sum(measure(f) for f in runs) / 3:.1%}"
      if steps == 500:
        assert cell == mean, (label, cell)
      else:
        stats = paired.interval([100 * (measure(a) - measure(b)) for a, b in zip(runs, base)])
        assert cell == f"{mean}; {interval_cell(stats, 1)}", (label, cell)
    total = {key: sum(f["forgetting"][key] for f in runs) for key in
             ("changed_forgotten", "changed_at_risk", "kept_forgotten", "kept_at_risk")}
    assert cells[2] == (f"{total['changed_forgotten']:,} of {total['changed_at_risk']:,} / "
                        f"{total['kept_forgotten']:,} of {total['kept_at_risk']:,}"), (label, cells[2])

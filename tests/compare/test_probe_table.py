"""The multilingual LM probe's table (docs/results.md, "The multilingual LM probe") says what the committed runs measured:
each row's seeds, training loss, valid and test perplexity, paired differences against dense and per-seed layer worth
are recomputed from ``results/lm_multi_cpu/comparison.json`` (the runs' own summaries and metrics)."""
from __future__ import annotations

import json

import pytest

from tests.compare.doc_tables import interval_cell, markdown_rows, typed_runs
from tests.conftest import REPO

from stablemoe_jax.compare import paired
from stablemoe_jax.train.health import least_contribution

REPORT = REPO / "results" / "lm_multi_cpu" / "comparison.json"
HEADER = "| method (union corpus, 850 steps) | seeds |"


def test_probe_table_is_the_committed_report():
  report = json.loads(REPORT.read_text())
  pairs = paired.paired_differences(typed_runs(report))
  rows = markdown_rows(REPO / "docs" / "results.md", HEADER)
  assert set(rows) == {entry["label"] for entry in report["methods"]}
  for entry in report["methods"]:
    runs = sorted((run for run in report["runs"] if run["method"] == entry["method"]), key=lambda run: run["seed"])
    against = pairs.get(entry["method"])
    expected = [", ".join(str(run["seed"]) for run in runs),
                f"{entry['train_loss_mean']:.3f} ± {entry['train_loss_std']:.3f}",
                f"{entry['valid_ppl_mean']:.2f} ± {entry['valid_ppl_std']:.2f}",
                f"{entry['test_ppl_mean']:.2f} ± {entry['test_ppl_std']:.2f}",
                interval_cell(against["train_loss"], 3) if against else "--",
                interval_cell(against["valid"], 2) if against else "--",
                ", ".join(f"{least_contribution(run['summary']['health']):+.2%}" for run in runs) if against else "--"]
    assert rows[entry["label"]] == expected, f"docs/results.md's {entry['label']} row differs from {REPORT.relative_to(REPO)}"
  # The training loss in the report is the runs' own: the mean task loss of the last 20% of steps in metrics.jsonl.
  for run in report["runs"]:
    lines = (REPO / run["workdir"] / "metrics.jsonl").read_text().splitlines()
    tail = [r["task_loss"] for r in map(json.loads, lines) if "task_loss" in r and r["step"] > 0.8 * 850]
    assert run["train_loss"] == pytest.approx(sum(tail) / len(tail), rel=1e-12)

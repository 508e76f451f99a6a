"""The paper's Table 4 at laptop scale (README.md, "Table 4: each method at its best") says what the committed sweep
measured: each row's choice, seeds, validation NLL, BLEU (average and per pair), training loss, paired intervals
against dense, and each MoE layer's worth and verdict are recomputed from ``results/tune_mt_cpu/comparison.json``
(the runs' own summaries), and a method whose seeds are in the report cannot stay marked as not finished."""
from __future__ import annotations

import importlib
import json
import re

from tests.compare.doc_tables import (check_report_is_committed_runs, check_rows_are_report, interval_cell,
                                      markdown_rows, spread_cell)
from tests.conftest import REPO

from stablemoe_jax.compare import paired, report as report_lib

REPORT = REPO / "results" / "tune_mt_cpu" / "comparison.json"
HEADER = "| method (Table 4 at laptop scale, 1,000 steps) | chosen lr (seed 0) |"
# The table's label of each method (the README's words) -> the method's name in the sweep.
LABELS = {
    "StableMoE (dot routing, `balance_scope=all`)": "stablemoe",
    "dense Transformer (same shared layers)": "dense",
    "Switch Transformer": "switch",
    "BASE Layer": "base",
    "Hash Layer": "hash",
    "dense of the MoE's FLOPs a token": "dense_flops",
}
CONTRASTS_HEADER = "| contrast (A - B, paired on the seeds both report) |"
SHORT_LABELS = {"stablemoe": "StableMoE", "dense": "dense", "switch": "Switch", "base": "BASE", "hash": "Hash",
                "dense_flops": "dense of the MoE's FLOPs"}
PAIRS = ("de-en", "fr-en", "cs-en", "es-en")
LAYERS = ("encoder_moe_0", "decoder_moe_0")


def choice_cell(choice: dict | None) -> str:
  """The table's words for a method's choice (None: its grid is not finished)."""
  if choice and choice.get("every_setting_diverged"):
    return "none: every setting diverged"
  return f"{choice['learning_rate']:.0e}".replace("e-0", "e-") if choice else "grid not finished"


def layer_cells(runs: list[dict]) -> list[str]:
  """Each layer's worth (valid PPL increase without it) per seed, and the layers the verdict finds dead."""
  worth = " / ".join(", ".join(f"{run['summary']['health']['contribution']['layers'][layer]['relative_perplexity_increase']:+.1%}"
                               for run in runs) for layer in LAYERS)
  dead = [f"seed {run['seed']} {layer.split('_')[0]}" for run in runs for layer in run["summary"]["health"]["dead_layers"]]
  return [worth, ", ".join(dead) or "none"]


def expected_cells(report: dict, method: str) -> list[str]:
  """The row the committed report gives ``method`` (every cell after the label)."""
  entry = next(e for e in report["methods"] if e["method"] == method)
  runs = sorted((run for run in report["runs"] if run["method"] == method), key=lambda run: run["seed"])
  against = paired.paired_differences(report["runs"]).get(method)
  moe = method not in ("dense", "dense_flops")
  return [choice_cell(report["choices"][method]), ", ".join(str(run["seed"]) for run in runs),
          spread_cell(entry["valid_loss_mean"], entry["valid_loss_std"], 3, len(runs)),
          spread_cell(entry["bleu_average_mean"], entry["bleu_average_std"], 2, len(runs)),
          " / ".join(f"{entry['bleu_per_pair'][pair]:.2f}" for pair in PAIRS),
          spread_cell(entry["train_loss_mean"], entry["train_loss_std"], 3, len(runs)),
          interval_cell(against["valid_nll"], 3) if against else "--",
          interval_cell(against["bleu"], 2) if against else "--",
          *(layer_cells(runs) if moe else ["--", "--"])]


def test_table4_is_the_committed_report():
  check_rows_are_report(markdown_rows(REPO / "README.md", HEADER), LABELS, json.loads(REPORT.read_text()),
                        expected_cells, choice_cell, "README's Table 4")


def test_contrasts_table_is_every_contrast_with_runs():
  """README's router-against-router table has one row per ``compare.contrasts`` of configs/tune_mt_cpu.py whose two
  methods have reported seeds, in order, each recomputed from the committed runs: A minus B seed by seed."""
  report = json.loads(REPORT.read_text())
  contrasts = report_lib.contrasts_of(importlib.import_module("configs.tune_mt_cpu").get_config())
  expected = {f"{SHORT_LABELS[method]} - {SHORT_LABELS[entry['baseline']]}":
              [interval_cell(entry["train_loss"], 3), interval_cell(entry["valid_nll"], 3),
               interval_cell(entry["bleu"], 2)]
              for method, entry in paired.contrast_differences(report["runs"], contrasts)}
  rows = markdown_rows(REPO / "README.md", CONTRASTS_HEADER)
  assert list(rows) == list(expected), f"README's contrasts: {list(rows)}; the report has {list(expected)}"
  assert rows == expected


def test_table4_report_is_the_committed_runs():
  """The committed report is the runs in results/tune_mt_cpu: every reported run's summary is the one on disk."""
  check_report_is_committed_runs(json.loads(REPORT.read_text()), REPO, ("valid", "bleu"))


def test_the_progress_counts_are_the_committed_runs():
  """While the sweep runs, README's heading and docs/translation.md say how many of its runs have finished: the
  number of finished runs (a ``summary.json`` each) under results/tune_mt_cpu."""
  finished = len(list(REPORT.parent.glob("*/*/seed*/summary.json")))
  heading = re.search(r"in progress, (\d+) of 32 runs\)", (REPO / "README.md").read_text())
  docs = re.search(r"\*\*In progress: (\d+) of 32\*\*", (REPO / "docs" / "translation.md").read_text())
  if finished == 32:  # done: neither may still say "in progress"
    assert heading is None and docs is None, "the sweep has finished: drop 'in progress' from README and the docs"
    return
  assert heading and docs, "README's Table 4 heading and docs/translation.md must say how many runs have finished"
  assert int(heading.group(1)) == int(docs.group(1)) == finished, (
      f"README says {heading.group(1)} and docs/translation.md {docs.group(1)} of 32 runs; {finished} have finished")

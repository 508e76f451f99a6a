"""The paper's Table 4 at laptop scale says what the committed sweep measured: the full table (docs/results.md, "The
paper's Table 4") with each row's choice, seeds, validation NLL, BLEU (average and per pair), training loss, paired
intervals against dense, each MoE layer's worth and the dead and weak layers, and README's short table (choice, seeds,
NLL, BLEU, the two paired intervals), are recomputed from ``results/tune_mt_cpu/comparison.json`` (the runs' own
summaries); a method whose seeds are in the report cannot stay marked as not finished, and the runs the rule still
needs are counted where the documents say how many are missing."""
from __future__ import annotations

import importlib
import json
import re

from tests.compare.doc_tables import (check_report_is_committed_runs, check_rows_are_report, interval_cell,
                                      markdown_rows, spread_cell, typed_runs)
from tests.conftest import REPO

from stablemoe_jax.compare import paired, report as report_lib
from stablemoe_jax.compare.comparison import Comparison

REPORT = REPO / "results" / "tune_mt_cpu" / "comparison.json"
HEADER = "| method (Table 4 at laptop scale, 1,000 steps) | chosen lr (seed 0) |"  # docs/results.md
SHORT_HEADER = "| method (Table 4, 1,000 steps) | chosen lr (seed 0) |"  # README.md
RESULTS = REPO / "docs" / "results.md"
# BASE's label says what its encoder layer does beside its row (issue 74): test_base_label_is_its_summaries.
BASE_LABEL = "BASE Layer (encoder gates 47% declined; flagged at step 250 in seeds 1, 3)"
# The table's label of each method (the documents' words) -> the method's name in the sweep.
LABELS = {
    "StableMoE (dot routing, `balance_scope=all`)": "stablemoe",
    "dense Transformer (same shared layers)": "dense",
    "Switch Transformer": "switch",
    BASE_LABEL: "base",
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
  """Each layer's worth (valid PPL increase without it) per seed, and the layers the verdict finds dead (the model
  as a whole) or weak (under the line while the other layer works)."""
  worth = " / ".join(", ".join(f"{run['summary']['health']['contribution']['layers'][layer]['relative_perplexity_increase']:+.1%}"
                               for run in runs) for layer in LAYERS)
  marks = [f"{kind} seed {run['seed']} {layer.split('_')[0]}" for kind in ("dead", "weak") for run in runs
           for layer in run["summary"]["health"].get(f"{kind}_layers", [])]
  return [worth, ", ".join(marks) or "none"]


def expected_cells(report: dict, method: str) -> list[str]:
  """The row the committed report gives ``method`` (every cell after the label)."""
  entry = next(e for e in report["methods"] if e["method"] == method)
  runs = sorted((run for run in report["runs"] if run["method"] == method), key=lambda run: run["seed"])
  against = paired.paired_differences(typed_runs(report)).get(method)
  moe = method not in ("dense", "dense_flops")
  return [choice_cell(report["choices"][method]), ", ".join(str(run["seed"]) for run in runs),
          spread_cell(entry["valid_loss_mean"], entry["valid_loss_std"], 3, len(runs)),
          spread_cell(entry["bleu_average_mean"], entry["bleu_average_std"], 2, len(runs)),
          " / ".join(f"{entry['bleu_per_pair'][pair]:.2f}" for pair in PAIRS),
          spread_cell(entry["train_loss_mean"], entry["train_loss_std"], 3, len(runs)),
          interval_cell(against["valid_nll"], 3) if against else "--",
          interval_cell(against["bleu"], 2) if against else "--",
          *(layer_cells(runs) if moe else ["--", "--"])]


def short_cells(report: dict, method: str) -> list[str]:
  """README's short row: choice, seeds, valid NLL, average BLEU and the two paired intervals against dense."""
  cells = expected_cells(report, method)
  return [cells[i] for i in (0, 1, 2, 3, 6, 7)]


def test_table4_is_the_committed_report():
  check_rows_are_report(markdown_rows(RESULTS, HEADER), LABELS, json.loads(REPORT.read_text()),
                        expected_cells, choice_cell, "docs/results.md's Table 4")


def test_readmes_short_table4_is_the_committed_report():
  check_rows_are_report(markdown_rows(REPO / "README.md", SHORT_HEADER), LABELS, json.loads(REPORT.read_text()),
                        short_cells, choice_cell, "README's Table 4")


def test_contrasts_table_is_every_contrast_with_runs():
  """README's router-against-router table has one row per ``compare.contrasts`` of configs/tune_mt_cpu.py whose two
  methods have reported seeds, in order, each recomputed from the committed runs: A minus B seed by seed."""
  report = json.loads(REPORT.read_text())
  contrasts = report_lib.contrasts_of(Comparison.of(importlib.import_module("configs.tune_mt_cpu").get_config()))
  expected = {f"{SHORT_LABELS[method]} - {SHORT_LABELS[entry['baseline']]}":
              [interval_cell(entry["train_loss"], 3), interval_cell(entry["valid_nll"], 3),
               interval_cell(entry["bleu"], 2)]
              for method, entry in paired.contrast_differences(typed_runs(report), contrasts)}
  rows = markdown_rows(RESULTS, CONTRASTS_HEADER)
  assert list(rows) == list(expected), f"docs/results.md's contrasts: {list(rows)}; the report has {list(expected)}"
  assert rows == expected


def test_table4_report_is_the_committed_runs():
  """The committed report is the runs in results/tune_mt_cpu: every reported run's summary is the one on disk."""
  check_report_is_committed_runs(json.loads(REPORT.read_text()), REPO, ("valid", "bleu"))


def missing_runs(report: dict) -> list[tuple[str, int]]:
  """(method, seed) of every seed the rule reports (1 to compare.seeds) that has no finished run at the choice."""
  expected = range(report["config"]["seed"] + 1, report["config"]["seed"] + report["config"]["compare"]["seeds"] + 1)
  reported = {(run["method"], run["seed"]) for run in report["runs"]}
  return [(method, k) for method, choice in report["choices"].items() if choice and "name" in choice
          for k in expected if (method, k) not in reported]


def test_the_missing_runs_are_counted_where_the_documents_say_so():
  """README's Table 4 and docs/translation.md say how many runs the rule still needs (and which), the report's
  table says "not trained" in those rows, and docs/translation.md names each missing run's folder beside the command
  that trains them; with none missing, neither document claims a missing run and no row says "not trained"."""
  report = json.loads(REPORT.read_text())
  missing = missing_runs(report)
  readme = re.search(r"(\d+) runs (?:are )?missing", (REPO / "README.md").read_text())
  translation = (REPO / "docs" / "translation.md").read_text()
  docs = re.search(r"\*\*(\d+) runs missing\*\*", translation)
  claimed = [int(found.group(1)) if found else 0 for found in (readme, docs)]
  assert claimed == [len(missing)] * 2, (claimed, missing)
  for method, seed in missing:
    setting = report["choices"][method]["name"]
    assert f"{method}/{setting}/seed{seed}" in translation, (method, seed)
  md = (REPORT.parent / "comparison.md").read_text()
  labels = {e["label"] for e in report["methods"] if e["method"] in {m for m, _ in missing}}
  not_trained = {line.split("|")[1].strip() for line in md.splitlines()
                 if line.startswith("| ") and "not trained" in line}
  assert not_trained == labels, (not_trained, labels)


def test_base_label_is_its_summaries():
  """BASE's label: the share of its encoder layer's gates under 0.01 in the last logged window (mean over the
  reported seeds), and the seeds whose encoder layer the per-layer guard flagged in training, at which step."""
  report = json.loads(REPORT.read_text())
  runs = [run for run in report["runs"] if run["method"] == "base"]
  healths = [json.loads((REPO / run["workdir"] / "summary.json").read_text())["health"] for run in runs]
  declined = sum(h["layers"]["encoder_moe_0"]["low_gate_fraction"] for h in healths) / len(healths)
  flagged = {run["seed"]: h["flagged_in_training"]["encoder_moe_0"]["step"]
             for run, h in zip(runs, healths) if "encoder_moe_0" in h["flagged_in_training"]}
  steps = set(flagged.values())
  assert len(steps) == 1
  assert BASE_LABEL == (f"BASE Layer (encoder gates {declined:.0%} declined; flagged at step {steps.pop()} in seeds "
                        f"{', '.join(str(k) for k in sorted(flagged))})")

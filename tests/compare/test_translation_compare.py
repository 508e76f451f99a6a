"""The comparison command for translation: the valid loss, test BLEU per pair and their average (Table 4),
and the health columns, from the runs' summary.json files."""
from __future__ import annotations

import json

import ml_collections
import pytest
from tests.mt_fixtures import copy_shared_run, shared_run_config

from stablemoe_jax.compare import report, runner, sweep_report
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.compare.comparison import Comparison

PAIRS = ("de-en", "fr-en", "cs-en", "es-en")


def _headers(markdown: str) -> list[str]:
  return [h.strip() for h in markdown.split("\n")[0].strip("|").split("|")]


def _summary(average, dead=()):
  """A translation run's summary.json as far as the table reads it."""
  per_pair = {pair: average + i for i, pair in enumerate(PAIRS)}
  layers = {"encoder_moe_1": {"mean_gate": 0.5, "low_gate_fraction": 0.1, "load_balance": 0.9, "max_load": 0.4,
                              "dropped_fraction": 0.0}}
  return RunSummary(
      valid={"loss": 2.0, "perplexity": 7.39}, test={"loss": 2.1, "perplexity": 8.17},
      bleu={"per_pair": per_pair, "average": average + 1.5, "signature": "nrefs:1|case:mixed"},
      tokens_per_second=100.0, train_seconds=60.0, eval={"mode": "teacher_forced_sentences"},
      health={"layers": layers, "dead_layers": list(dead),
              "contribution": {"layers": {"encoder_moe_1": {"relative_perplexity_increase": 0.05},
                                          "decoder_moe_1": {"relative_perplexity_increase": average / 100}}}})


def test_translation_table_has_bleu_per_pair_and_marks_dead_layers():
  records = [{"method": name, "label": name, "seed_index": 0, "seed": 0, "overrides": {}, "summary": summary,
              "curve": [[60.0, 7.39]], "fluctuation": None, "shared_params": 1e6, "expert_params": 2e6,
              "total_params": 3e6, "flops_per_token": 1e6}
             for name, summary in [("stablemoe", _summary(30.0)), ("switch", _summary(20.0, ["decoder_moe_1"]))]]
  rows = report.method_rows(records)
  table = report.markdown_table(rows)
  headers = _headers(table)
  assert headers[:4] == ["method", "shared params", "expert params", "valid loss"]
  assert headers[4:9] == ["de→en BLEU", "fr→en BLEU", "cs→en BLEU", "es→en BLEU", "average BLEU"]
  assert "valid PPL" not in headers and "FLOPs / token (fwd)" not in headers
  assert {"mean gate", "gates < 0.01", "load balance", "max load", "dropped"} <= set(headers)
  lines = table.splitlines()
  assert "| 30.00 | 31.00 | 32.00 | 33.00 | 31.50 |" in lines[2]
  assert lines[3].startswith("| switch (DEAD LAYER) |") and "DEAD LAYER: decoder_moe_1 (seed 0)" in lines[3]
  # Each layer's worth, the encoder's and the decoder's (the LM's one column shows only the least).
  assert "valid PPL increase without each layer" in headers
  assert "| decoder_moe_1 +30.00% / encoder_moe_1 +5.00% |" in lines[2]
  assert "| decoder_moe_1 +20.00% / encoder_moe_1 +5.00% |" in lines[3]


def test_tuned_translation_table_has_the_chosen_setting_and_bleu():
  """The tuned comparison's table (sweep_report) keeps translation's columns: Table 4's, not the LM's perplexity."""
  record = {"method": "stablemoe", "label": "StableMoE", "seed_index": 1, "seed": 1, "overrides": {},
            "summary": _summary(30.0), "curve": [[60.0, 7.39]], "fluctuation": None, "shared_params": 1e6,
            "expert_params": 2e6, "total_params": 3e6, "flops_per_token": 1e6, "train_loss": 3.25}
  rows = report.method_rows([record])
  rows[0]["setting"] = {"learning_rate": 1e-3, "warmup_steps": 200}
  table = report.markdown_table(rows, sweep_report.sweep_columns(rows))
  headers = _headers(table)
  assert headers[:5] == ["method", "chosen lr / warmup", "seeds", "shared params", "expert params"]
  assert {"valid loss", "average BLEU", "train loss (last 20% of steps)"} <= set(headers)
  assert "valid PPL" not in headers and "test PPL" not in headers
  assert "| StableMoE | 0.001 / 200 | 1 |" in table and "| 31.50 |" in table and "| 3.250 |" in table


@pytest.mark.slow
def test_translation_comparison_end_to_end(mt_shared_run, tmp_path):
  # The StableMoE run is the shared one (conftest.mt_shared_run, trained by runner.run_all with methods=stablemoe):
  # run_all finds it finished and trains dense beside it on the same prepared data.
  _, workdir, _, _ = copy_shared_run(mt_shared_run, tmp_path / "compare")
  config = shared_run_config(mt_shared_run.parent / "corpora")
  config.compare = ml_collections.ConfigDict({"methods": "stablemoe,dense", "seeds": 1})
  records = runner.run_all(Comparison.of(config), workdir)
  rows = report.write_reports(Comparison.of(config), records, workdir)
  table = (workdir / "comparison.md").read_text()
  headers = _headers(table.split("\n\n")[2])
  assert headers[3:9] == ["valid loss", "de→en BLEU", "fr→en BLEU", "cs→en BLEU", "es→en BLEU", "average BLEU"]
  saved = json.loads((workdir / "comparison.json").read_text())["methods"]
  for row, name in zip(rows, ("stablemoe", "dense")):
    summary = json.loads((workdir / name / "seed0" / "summary.json").read_text())
    assert row["valid_loss_mean"] == summary["valid"]["loss"]
    assert row["bleu_per_pair"] == summary["bleu"]["per_pair"] and set(row["bleu_per_pair"]) == set(PAIRS)
    assert row["bleu_average_mean"] == summary["bleu"]["average"]
    line = next(l for l in table.splitlines() if l.startswith(f"| {row['label']}"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == f"{summary['valid']['loss']:.2f}"
    assert cells[4:9] == [f"{summary['bleu']['per_pair'][p]:.2f}" for p in PAIRS] + [
        f"{summary['bleu']['average']:.2f}"]
    assert saved[rows.index(row)]["bleu_average_mean"] == summary["bleu"]["average"]
  stablemoe, dense = rows
  assert stablemoe["health"]["moe_layers"] == 2 and stablemoe["fluctuation"] is not None
  assert dense["health"]["moe_layers"] == 0 and "no MoE layer" in table

"""The comparison's training loss (the mean logged task loss over the last 20% of the steps) and its named held-out
sets (``data.eval_sets``, the multilingual LM probe's sources): per run, per method and paired against dense."""
from __future__ import annotations

import dataclasses

import pytest

from stablemoe_jax.compare import paired, report, runner
from stablemoe_jax.core.summary import RunSummary


def test_training_loss_is_the_mean_task_loss_of_the_last_fifth_of_the_steps():
  records = [{"step": 50, "task_loss": 9.0, "loss": 9.5}, {"step": 80, "task_loss": 7.0},  # step 80 is not after 80%
             {"step": 80, "valid/perplexity": 30.0}, {"step": 90, "task_loss": 4.0, "loss": 4.25},
             {"step": 100, "task_loss": 3.0, "loss": 3.5}, {"step": 100, "valid/perplexity": 20.0}]
  assert runner.training_loss(records, steps=100) == pytest.approx(3.5)  # (4 + 3) / 2: task loss, not loss
  assert runner.training_loss(records[:3], steps=100) is None


def _record(method: str, seed: int, train_loss: float | None, sets: dict[str, float]) -> dict:
  """A run record as far as the report and the pairing read it; ``sets``: {name: valid perplexity}."""
  summary = RunSummary(valid={"loss": 4.0, "perplexity": 54.6}, test={"loss": 4.1, "perplexity": 60.3},
                       tokens_per_second=100.0, train_seconds=60.0, eval={"mode": "blocks", "seq_len": 128},
                       sets={name: {"valid": {"perplexity": ppl}, "test": {"perplexity": ppl + 10}}
                             for name, ppl in sets.items()})
  return {"method": method, "label": method.title(), "seed_index": seed, "seed": seed, "overrides": {},
          "summary": summary, "train_loss": train_loss, "curve": [[60.0, 54.6]], "fluctuation": None,
          "shared_params": 1e6, "expert_params": 0.0, "total_params": 1e6, "flops_per_token": 1e6}


RECORDS = [_record("dense", 0, 5.0, {"ptb": 100.0, "bible_es": 40.0}),
           _record("dense", 1, 5.2, {"ptb": 110.0, "bible_es": 44.0}),
           _record("switch", 0, 4.9, {"ptb": 95.0, "bible_es": 40.0}),
           _record("switch", 1, 5.0, {"ptb": 104.8, "bible_es": 42.0})]
T_975_1 = 12.7062  # the two-sided 95% Student-t quantile with one degree of freedom


def test_training_loss_and_each_set_are_paired_with_dense_seed_by_seed():
  entry = paired.paired_differences(RECORDS)["switch"]
  assert entry["seeds"] == [0, 1]
  assert entry["train_loss"]["differences"] == pytest.approx([-0.1, -0.2])
  # mean -0.15; sample std of (-0.1, -0.2) is 0.0707, so the half-width is t * 0.0707 / sqrt(2) = t * 0.05
  assert entry["train_loss"]["mean"] == pytest.approx(-0.15)
  assert entry["train_loss"]["high"] == pytest.approx(-0.15 + T_975_1 * 0.05, rel=1e-4)
  assert entry["train_loss"]["reading"] == "not distinguishable"
  assert entry["set/ptb"]["differences"] == pytest.approx([-5.0, -5.2])
  assert entry["set/ptb"]["high"] == pytest.approx(-5.1 + T_975_1 * 0.1, rel=1e-4)  # -3.83: below 0
  assert entry["set/ptb"]["reading"] == "lower"
  assert entry["set/bible_es"]["differences"] == pytest.approx([0.0, -2.0])
  # A run without a training loss (exported before it was kept) leaves that metric unpaired, not wrong.
  older = [{**r, "train_loss": None} if r["method"] == "dense" and r["seed"] == 1 else r for r in RECORDS]
  assert paired.paired_differences(older)["switch"]["train_loss"] == {
      "differences": [], "n": 0, "mean": None, "low": None, "high": None, "reading": "too few paired seeds"}
  assert "set/ptb" not in paired.paired_differences([{**r, "summary": dataclasses.replace(r["summary"], sets={})}
                                                      for r in RECORDS])["switch"]


def test_report_shows_the_training_loss_and_each_sets_perplexity_per_method():
  rows = report.method_rows(RECORDS)
  table = report.markdown_table(rows)
  assert "train loss (last 20% of steps)" in table.splitlines()[0]
  assert "| 5.100 ± 0.141 |" in table.splitlines()[2] and "| 4.950 ± 0.071 |" in table.splitlines()[3]
  section = report.sets_section(rows, paired.paired_differences(RECORDS))
  assert "| method | ptb valid / test PPL | bible_es valid / test PPL |" in section
  assert "| Dense | 105.00 / 115.00 | 42.00 / 52.00 |" in section
  assert "| Switch | 99.90 / 109.90 | 41.00 / 51.00 |" in section
  assert f"| Switch | Dense | 0, 1 | -5.10 [{-5.1 - T_975_1 * 0.1:+.2f}, {-5.1 + T_975_1 * 0.1:+.2f}] (lower) |" in section
  assert report.sets_section(report.method_rows([{**r, "summary": dataclasses.replace(r["summary"], sets={})} for r in RECORDS]),
                             paired.paired_differences(RECORDS)) == ""
  paired_table = report.paired_section(paired.paired_differences(RECORDS), {"switch": "Switch", "dense": "Dense"})
  assert "train loss difference [95% CI]" in paired_table and "| -0.150 [" in paired_table

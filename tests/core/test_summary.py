"""RunSummary: every committed summary.json loads through it and is written back byte for byte; old versions' absent
keys, unknown keys and a later schema version."""
from __future__ import annotations

import json
import pathlib

import pytest

from stablemoe_jax.core.summary import RunSummary

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "results"


def _committed_summaries() -> list[pathlib.Path]:
  """Every run's summary.json under results/ (the facts probe's own facts/summary.json is not a run's)."""
  return [p for p in sorted(RESULTS.rglob("summary.json")) if p.parent.name != "facts"]


def test_every_committed_summary_loads_and_writes_back_byte_for_byte():
  paths = _committed_summaries()
  assert len(paths) >= 200
  for path in paths:
    summary = RunSummary.load(path)
    assert json.dumps(summary.to_json(), indent=2) == path.read_text(), path
    assert summary.valid["perplexity"] > 0 and summary.steps > 0 and not summary.extra, path


def test_a_summary_from_before_device_and_num_groups_has_them_as_none():
  old = {"steps": 850, "stage1_steps": 300, "train_seconds_this_run": 1.0, "train_seconds": 1.0,
         "tokens_per_second": 2.0, "distill_agreement_at_boundary": None, "eval": {"mode": "blocks"},
         "valid": {"perplexity": 3.0}, "test": {"perplexity": 4.0}, "health": {}}
  summary = RunSummary.from_json(old)
  assert summary.device is None and summary.num_groups is None and summary.bleu is None
  assert list(summary.to_json()) == list(old)  # nothing added: absent stays absent, the null agreement stays


def test_the_written_order_puts_each_key_where_the_loop_wrote_it():
  summary = RunSummary(steps=1, stage1_steps=0, device={"count": 1}, num_groups=2, train_seconds_this_run=1.0,
                       train_seconds=1.0, tokens_per_second=2.0, eval={}, valid={}, test={}, health={},
                       bleu={"average": 1.0}, pair_weights={}, over_length={}, analysis={"a": 1})
  assert list(summary.to_json()) == ["steps", "stage1_steps", "device", "num_groups", "train_seconds_this_run",
                                     "train_seconds", "tokens_per_second", "distill_agreement_at_boundary", "eval",
                                     "valid", "test", "health", "bleu", "pair_weights", "over_length", "analysis"]


def test_unknown_keys_are_kept_after_the_fields_and_a_later_version_is_refused():
  summary = RunSummary.from_json({"steps": 3, "added_later": [1, 2]})
  assert summary.extra == {"added_later": [1, 2]}
  assert summary.to_json() == {"steps": 3, "distill_agreement_at_boundary": None, "added_later": [1, 2]}
  with pytest.raises(ValueError, match="schema_version 2"):
    RunSummary.from_json({"schema_version": 2, "steps": 3})

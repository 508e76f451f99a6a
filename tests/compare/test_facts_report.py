"""The facts regime's columns in a comparison report (stablemoe_jax/compare/facts_cells.py): recall with its spread,
value NLL, the experts the facts use and P(forget) when the route changed / was kept, means over seeds, by hand."""
from __future__ import annotations

import pytest

from stablemoe_jax.compare import facts_cells, report
from stablemoe_jax.core.summary import RunSummary


def _facts(recall: float, value_nll: float, experts: float | None, changed: float | None, kept: float | None) -> dict:
  final = {"facts/recall": recall, "facts/value_nll": value_nll}
  if experts is not None:
    final["facts/moe_0/value_experts"] = experts
  return {"final": final, "forgetting": {"p_forget_changed": changed, "p_forget_kept": kept},
          "route_changing_after": {"after_20": 0.0, "after_50": 0.0, "after_80": 0.0}}


def _record(method: str, seed: int, facts: dict | None) -> dict:
  summary = RunSummary(valid={"loss": 2.0, "perplexity": 7.4}, test={"loss": 2.0, "perplexity": 7.4},
                       tokens_per_second=100.0, train_seconds=60.0, eval={"mode": "blocks", "seq_len": 60}, facts=facts)
  return {"method": method, "label": method.title(), "seed_index": seed, "seed": seed, "overrides": {},
          "summary": summary, "train_loss": 2.0, "curve": [[60.0, 7.4]], "fluctuation": None,
          "shared_params": 1e5, "expert_params": 0.0, "total_params": 1e5, "flops_per_token": 1e5}


def test_each_method_s_recall_nll_experts_and_forgetting_by_hand():
  records = [_record("dense", 1, _facts(0.20, 2.0, None, None, 0.10)),
             _record("dense", 2, _facts(0.24, 1.8, None, None, 0.14)),
             _record("switch", 1, _facts(0.90, 0.2, 5.0, 0.30, 0.02)),
             _record("switch", 2, _facts(0.96, 0.1, 6.0, None, 0.04))]
  rows = report.method_rows(records)
  assert rows[0]["facts_recall_mean"] == pytest.approx(0.22) and rows[1]["facts_recall_mean"] == pytest.approx(0.93)
  assert rows[1]["facts_recall_std"] == pytest.approx(0.0424264, rel=1e-4)  # sample std of 0.90, 0.96
  assert rows[1]["facts_p_forget_changed"] == pytest.approx(0.30)  # a seed with no changed route is left out
  assert rows[1]["facts_p_forget_kept"] == pytest.approx(0.03)
  table = report.markdown_table(rows).splitlines()
  header = [cell.strip() for cell in table[0].strip("|").split("|")]
  assert "test PPL" not in header
  assert header[header.index("valid PPL") + 1:header.index("valid PPL") + 5] == [
      "recall", "value NLL", "experts the facts use", "forgetting: route changed / kept"]
  dense, switch = ([c.strip() for c in line.strip("|").split("|")] for line in table[2:4])
  at = header.index("recall")
  assert dense[at:at + 4] == ["22.0% ± 2.8%", "1.900", "--", "-- / 12.0%"]
  assert switch[at:at + 4] == ["93.0% ± 4.2%", "0.150", "5.5", "30.0% / 3.0%"]


def test_runs_without_facts_keep_the_language_model_s_columns():
  records = [_record("dense", 1, None), _record("switch", 1, _facts(0.9, 0.2, 5.0, 0.3, 0.02))]
  rows = report.method_rows(records)
  assert "facts_recall" not in rows[0] and facts_cells.facts_cells([records[0]["summary"]]) == {}
  assert "test PPL" in report.markdown_table(rows).splitlines()[0]  # one run without facts: the LM's table

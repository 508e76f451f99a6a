"""Router health on a model with more than one MoE layer (issue 74): the model is judged as a whole. It is dead when
its MoE layers, all removed at once, cost less than ``health.min_contribution``, or when every layer is under the line;
a layer under the line while another works is weak (reported, never a dead run). Two-layer summaries built by hand:
one weak and one working layer, both weak, one exactly at the line; the verdict, the guard in training, the report's
mark, and the all-layers measure against a hand-built evaluation."""
from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from configs import default
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.analysis import contribution
from stablemoe_jax.compare import report
from stablemoe_jax.experiment import actions
from stablemoe_jax.train import health
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.compare.comparison import Comparison

LINE = 0.01  # health.min_contribution's default
ENC, DEC = "encoder_moe_0", "decoder_moe_0"


def _health(enc: float, dec: float, all_layers: float | None = None) -> dict:
  """A two-layer health section: each layer's worth, and the worth of both removed at once (None: not measured)."""
  layers = {layer: {"mean_gate": 0.5, "low_gate_fraction": 0.0, "load_balance": 0.95, "max_load": 0.2,
                    "dropped_fraction": 0.0, "load_entropy": 2.0, "top2_load": 0.3, "num_experts": 8.0}
            for layer in (ENC, DEC)}
  section = {"layers": layers, "contribution": {"layers": {
      ENC: {"relative_perplexity_increase": enc}, DEC: {"relative_perplexity_increase": dec}}}}
  if all_layers is not None:
    section["contribution"]["all_layers"] = {"layers": [ENC, DEC], "relative_perplexity_increase": all_layers}
  return {**section, **health.verdict(section)}


def test_one_weak_and_one_working_layer_is_a_live_model_with_a_weak_layer():
  # Table 4's StableMoE at 2e-3, seed 1: encoder +0.77%, decoder +15.1%.
  judged = _health(0.0077, 0.151, all_layers=0.17)
  assert judged["ok"] and judged["dead_layers"] == [] and judged["weak_layers"] == [ENC]
  assert judged["verdict"][ENC]["weak"] and not judged["verdict"][ENC]["dead"]
  assert "+0.77% < health.min_contribution=0.01" in judged["verdict"][ENC]["reasons"][0]
  assert not judged["verdict"][DEC]["weak"] and not judged["verdict"][DEC]["dead"]
  assert judged["model"] == {"dead": False, "reasons": [], "all_layers_contribution": 0.17,
                             "judged_from": "all MoE layers removed at once"}
  # Without the all-layers measure (a committed run that predates it): judged from its per-layer numbers.
  old = _health(0.0077, 0.151)
  assert old["ok"] and old["weak_layers"] == [ENC] and old["model"]["all_layers_contribution"] is None
  assert "each layer's own numbers only" in old["model"]["judged_from"]


def test_both_layers_weak_is_a_dead_model_even_when_both_removed_cost_more_than_the_line():
  for all_layers in (0.012, 0.004, None):
    judged = _health(0.005, 0.008, all_layers)
    assert not judged["ok"] and judged["dead_layers"] == [DEC, ENC] and judged["weak_layers"] == []
    assert any("every one of its 2 MoE layers is under the line" in r for r in judged["model"]["reasons"])
    assert all(v["dead"] and not v["weak"] for v in judged["verdict"].values())
  # both under the line and both removed under it too: both reasons
  assert len(_health(0.005, 0.008, 0.004)["model"]["reasons"]) == 2


def test_the_all_layers_measure_alone_can_kill_the_model():
  judged = _health(0.02, 0.03, all_layers=LINE - 1e-4)
  assert not judged["ok"] and judged["dead_layers"] == [DEC, ENC]
  assert "removing all 2 MoE layers at once raises validation perplexity by +0.99%" in judged["model"]["reasons"][0]


def test_exactly_at_the_line_works():
  # one layer exactly at 1%, the other under it: the first works, the second is weak, the model alive
  judged = _health(LINE, 0.005, all_layers=0.02)
  assert judged["ok"] and judged["weak_layers"] == [DEC] and not judged["verdict"][ENC]["weak"]
  # both removed at once exactly at the line: alive
  judged = _health(0.02, 0.03, all_layers=LINE)
  assert judged["ok"] and judged["weak_layers"] == [] and judged["model"]["reasons"] == []
  # a hair under on both layers: dead
  assert not _health(LINE - 1e-9, LINE - 1e-9, all_layers=LINE)["ok"]


def test_one_moe_layer_keeps_its_verdict_and_its_keys():
  section = {"layers": {"moe_0": {"top2_load": 0.3, "num_experts": 8.0}},
             "contribution": {"layers": {"moe_0": {"relative_perplexity_increase": 0.005}}}}
  judged = health.verdict(section)
  assert set(judged) == {"ok", "dead_layers", "verdict"} and judged["dead_layers"] == ["moe_0"]
  assert set(judged["verdict"]["moe_0"]) == {"dead", "reasons", "contribution", "top2_load"}


# --- the guard in training ------------------------------------------------------------------------------------------

def _guard(**health_changes):
  config = default.get_config()
  config.train.warmup_steps = 10
  for key, value in health_changes.items():
    config.health[key] = value
  return health.CollapseGuard(health.GuardSettings.from_settings(from_config(config)), start_step=10)


def test_guard_flags_a_weak_layer_once_and_never_stops_for_it(capsys):
  guard = _guard(on_collapse="stop")
  found = guard.observe_contribution(20, {ENC: 0.002, DEC: 0.15}, all_layers=0.16)
  assert [(c.layer, c.weak, c.dead) for c in found] == [(ENC, True, False)]
  actions.handle_collapses(guard, found, last_checkpoint=10)  # no CollapseError
  err = capsys.readouterr().err
  assert f"MoE layer {ENC}" in err and "is weak at step 20" in err and "+0.20%" in err
  assert guard.observe_contribution(30, {ENC: 0.003, DEC: 0.14}, all_layers=0.15) == []  # flagged once
  summary = guard.summary({"layers": {ENC: {"relative_perplexity_increase": 0.003},
                                      DEC: {"relative_perplexity_increase": 0.14}},
                           "all_layers": {"relative_perplexity_increase": 0.15}})
  assert summary["weak_in_training"] == {ENC: {"step": 20, "reasons": [pytest.approx(
      summary["weak_in_training"][ENC]["reasons"][0])]}}
  assert summary["flagged_in_training"] == {} and summary["ok"] and summary["weak_layers"] == [ENC]


@pytest.mark.parametrize("contributions, all_layers", [({ENC: 0.002, DEC: 0.004}, 0.012),
                                                       ({ENC: 0.02, DEC: 0.03}, 0.005)])
def test_guard_flags_every_layer_dead_when_the_model_is(contributions, all_layers):
  guard = _guard()
  found = guard.observe_contribution(20, contributions, all_layers)
  assert sorted((c.layer, c.dead, c.weak) for c in found) == [(DEC, True, False), (ENC, True, False)]
  assert "is dead at step 20" in found[0].message()


def test_guard_replays_the_all_layers_measure_from_the_log():
  records = [{"step": 20, f"moe/{ENC}/contribution": 0.02, f"moe/{DEC}/contribution": 0.03,
              health.ALL_LAYERS_KEY: 0.004}]
  guard = _guard()
  assert sorted(c.layer for c in guard.replay(records, 20)) == [DEC, ENC]
  assert health.logged_contributions(records[0]) == {ENC: 0.02, DEC: 0.03}  # the key is no layer


# --- the all-layers measure -----------------------------------------------------------------------------------------

def test_all_layers_measure_removes_every_layer_at_once():
  params = {ENC: {"experts": {"w_out": np.full(2, 1.0), "b_out": np.zeros(2)}},
            DEC: {"experts": {"w_out": np.full(2, 2.0), "b_out": np.zeros(2)}}, "embed": {"w": np.ones(2)}}

  def evaluate(p, max_batches):  # perplexity 10 + the experts' weights left: each layer's worth, added up
    ppl = 10.0 + sum(float(np.sum(p[layer]["experts"]["w_out"])) for layer in (ENC, DEC) if p[layer])
    return {"loss": float(np.log(ppl)), "perplexity": ppl, "tokens": 4}

  result = contribution.layer_contributions(evaluate, params, max_batches=2)
  assert result["perplexity"] == 16.0
  assert result["layers"][ENC]["relative_perplexity_increase"] == pytest.approx(14 / 16 - 1)
  assert result["layers"][DEC]["relative_perplexity_increase"] == pytest.approx(12 / 16 - 1)
  assert result["all_layers"]["relative_perplexity_increase"] == pytest.approx(10 / 16 - 1)
  assert result["all_layers"]["layers"] == contribution.moe_layer_names(params)
  one = contribution.layer_contributions(evaluate, {**params, DEC: {}})  # one MoE layer: nothing added
  assert "all_layers" not in one


# --- the report's mark ----------------------------------------------------------------------------------------------

def _record(method, label, seed, section):
  summary = RunSummary(valid={"perplexity": 10.0}, test={"perplexity": 11.0}, tokens_per_second=1.0,
                       train_seconds=60.0, distill_agreement_at_boundary=None, health=section)
  return {"method": method, "label": label, "seed": seed, "overrides": {}, "summary": summary,
          "curve": [[60.0, 10.0]], "fluctuation": None, "shared_params": 1, "expert_params": 1, "total_params": 2,
          "flops_per_token": 1}


def test_the_report_marks_a_weak_layer_and_a_dead_model(tmp_path):
  records = [_record("weak", "one weak layer", 1, _health(0.0077, 0.151)),
             _record("weak", "one weak layer", 2, _health(0.03, 0.12, 0.16)),
             _record("both", "both weak", 1, _health(0.005, 0.008, 0.012)),
             _record("line", "at the line", 1, _health(LINE, 0.02, LINE))]
  config = default.get_config()
  config.compare = ml_collections.ConfigDict({"methods": "weak", "seeds": 2})
  report.write_reports(Comparison.of(config), records, tmp_path)
  table = (tmp_path / "comparison.md").read_text()
  rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
  assert "| ok; weak layer: encoder_moe_0 (seed 1) |" in rows["| one weak layer"]
  assert "| DEAD LAYER: decoder_moe_0 (seed 1), encoder_moe_0 (seed 1) |" in rows["| both weak (DEAD LAYER)"]
  assert "| ok |" in rows["| at the line"]
  assert "**weak layer** (one weak layer)" in table and "**DEAD LAYER** (both weak)" in table


def test_the_sweeps_log_line_names_a_weak_layer():
  from stablemoe_jax.compare import runner  # pylint: disable=import-outside-toplevel
  lines = []
  summary = RunSummary(valid={"perplexity": 10.0}, test={"perplexity": 11.0}, health=_health(0.0077, 0.151))
  runner.log_result(lambda text, flush: lines.append(text), "[3/30] stablemoe seed 1", "finished", summary)
  runner.log_result(lambda text, flush: lines.append(text), "[4/30] hash seed 1", "finished",
                    summary.with_health(_health(0.07, 0.3)))
  assert lines[0].endswith("; weak layer: encoder_moe_0 (the model is alive)") and "weak" not in lines[1]

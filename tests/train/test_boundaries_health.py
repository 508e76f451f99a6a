"""Router health's rules at their edges (issue 51): each threshold on both sides, the guard's start (``after_step``,
0 included), patience, the settings a run records and :func:`health.judge_health` reading them back, the load
re-read from the log, and the ``health`` section's config checks. Pure functions on synthetic windows: no model,
no training (the whole file runs in about a second)."""
from __future__ import annotations

import dataclasses
import math
import types

import numpy as np
import pytest

from configs import default
from stablemoe_jax.analysis import contribution
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core.settings import HealthSettings, from_config, typed
from stablemoe_jax.train import health

BALANCED = [0.125] * 8
ONE_EXPERT = [0.93, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01]  # 94% of the tokens on the two busiest


def _config(warmup: int = 10, **section):
  config = default.get_config()
  config.train.warmup_steps = warmup
  for key, value in section.items():
    config.health[key] = value
  return config


def _settings(warmup: int = 10, **section):
  return health.GuardSettings.from_settings(from_config(_config(warmup, **section)))


def _window(load=BALANCED, gate=0.5, balance=0.9, layer="moe_0"):
  return {f"moe/{layer}/mean_gate": gate, f"moe/{layer}/low_gate_fraction": 0.0,
          f"moe/{layer}/load_balance": balance, f"moe/{layer}/max_load": max(load), f"moe/{layer}/load": load,
          f"moe/{layer}/dropped_fraction": 0.0, f"moe/{layer}/load_entropy": 1.0, "loss": 5.0}


# --- the guard's start: health.after_step ----------------------------------------------------------------------------

@pytest.mark.parametrize("after_step, warmup, resolved", [(0, 10, 0), (-1, 10, 10), (-1, 0, 0), (7, 10, 7)])
def test_after_step_resolves_to_itself_and_only_minus_one_to_the_warmup(after_step, warmup, resolved):
  assert _settings(warmup, after_step=after_step).after_step == resolved


def test_after_step_0_judges_from_the_first_step_not_after_the_warmup():
  """``after_step=0``: the window of steps 1-5 already counts (the warmup is 10 steps); with -1 it does not."""
  from_start = health.CollapseGuard(_settings(warmup=10, after_step=0, patience=1))
  found = from_start.observe(5, _window(load=ONE_EXPERT))
  assert [(c.layer, c.step, c.dead) for c in found] == [("moe_0", 5, True)]
  assert from_start.observe_contribution(1, {"moe_1": 0.0})[0].step == 1  # an evaluation at step 1 counts too
  after_warmup = health.CollapseGuard(_settings(warmup=10, after_step=-1, patience=1))
  assert after_warmup.observe(5, _window(load=ONE_EXPERT)) == []
  assert after_warmup.observe_contribution(10, {"moe_1": 0.0}) == []


@pytest.mark.parametrize("after_step, counted", [(10, True), (11, False)])
def test_a_window_counts_only_when_its_first_step_lies_after_after_step(after_step, counted):
  guard = health.CollapseGuard(_settings(after_step=after_step, patience=1))
  assert guard.observe(10, _window(load=ONE_EXPERT)) == []  # steps 1-10
  assert bool(guard.observe(20, _window(load=ONE_EXPERT))) is counted  # steps 11-20


def test_a_resumed_guard_starts_its_first_window_after_the_checkpoint():
  guard = health.CollapseGuard(_settings(after_step=10, patience=1), start_step=10)
  assert len(guard.observe(15, _window(load=ONE_EXPERT))) == 1  # steps 11-15, all after step 10


@pytest.mark.parametrize("patience", [1, 3])
def test_patience_windows_in_a_row_and_not_one_fewer(patience):
  guard = health.CollapseGuard(_settings(after_step=0, patience=patience))
  for k in range(1, patience):
    assert guard.observe(10 * k, _window(load=ONE_EXPERT)) == []
  assert [c.step for c in guard.observe(10 * patience, _window(load=ONE_EXPERT))] == [10 * patience]


# --- the rules' thresholds, both sides -------------------------------------------------------------------------------

@pytest.mark.parametrize("top2, experts, dead", [(0.9, 8, False), (0.9001, 8, True), (0.99, 3, True),
                                                  (0.99, 2, False), (None, 8, False)])
def test_degenerate_routing_is_strictly_above_the_share_and_needs_more_than_two_experts(top2, experts, dead):
  values = {"num_experts": float(experts), **({} if top2 is None else {"top2_load": top2})}
  assert bool(health.degenerate_reasons(values, 0.9)) is dead


@pytest.mark.parametrize("worth, dead", [(0.01, False), (0.0099999, True), (-0.02, True), (None, False)])
def test_contribution_rule_is_strictly_below_the_minimum(worth, dead):
  assert bool(health.contribution_reasons(worth, 0.01)) is dead


@pytest.mark.parametrize("gate, warned", [(0.05, False), (0.0499, True)])
def test_gate_position_warning_is_strictly_below_the_setting(gate, warned):
  """A dot-product sigmoid gate's range is [0, 1]: its position is the gate itself."""
  settings = dataclasses.replace(_settings(min_gate_position=0.05), affinity="dot")  # the default's is cosine
  reasons = health.warning_reasons({"mean_gate": gate}, settings)
  assert bool(reasons) is warned


def test_a_cosine_gate_is_placed_in_sigmoid_of_plus_or_minus_one_over_tau():
  settings = dataclasses.replace(_settings(), affinity="cosine")
  tau = 0.5
  low, high = 1 / (1 + math.exp(2.0)), 1 / (1 + math.exp(-2.0))
  assert health.gate_range(settings, {"router_temperature": tau}) == pytest.approx((low, high))
  at_floor_plus = low + 0.05 * (high - low)
  assert health.gate_position(settings, {"mean_gate": at_floor_plus, "router_temperature": tau}) == pytest.approx(0.05)
  assert health.gate_range(settings, {"router_temperature": 0.0}) is None  # no attainable range to place it in
  assert health.gate_range(settings, {}) is None


def test_a_switch_gate_ranges_from_one_over_n_experts():
  settings = dataclasses.replace(_settings(), gate="softmax", num_experts=4)
  assert health.gate_range(settings, {}) == (0.25, 1.0)
  assert health.gate_position(settings, {"mean_gate": 0.25}) == 0.0


@pytest.mark.parametrize("balance, warned", [(0.5, False), (0.4999, True)])
def test_load_balance_warning_is_strictly_below_the_setting(balance, warned):
  assert bool(health.warning_reasons({"load_balance": balance}, _settings(min_load_balance=0.5))) is warned


# --- every recorded setting read back with a non-default value -------------------------------------------------------

def test_every_health_setting_is_read_from_the_config():
  config = _config(warmup=10, min_contribution=0.02, max_top2_load=0.8, min_gate_position=0.1, min_load_balance=0.3,
                   patience=4, after_step=5, on_collapse="stop")
  config.model.moe.router, config.model.moe.num_experts = "switch", 6
  settings = health.GuardSettings.from_settings(from_config(config))
  assert (settings.min_contribution, settings.max_top2_load, settings.min_gate_position, settings.min_load_balance,
          settings.patience, settings.after_step, settings.on_collapse, settings.router, settings.gate,
          settings.num_experts) == (0.02, 0.8, 0.1, 0.3, 4, 5, "stop", "switch", "softmax", 6)
  config.model.moe.router = "stablemoe"
  config.model.moe.stablemoe.affinity = "cosine"
  assert health.GuardSettings.from_settings(from_config(config)).affinity == "cosine"


def test_the_guard_judges_at_its_own_thresholds_and_records_them():
  def guard():
    return health.CollapseGuard(_settings(after_step=0, patience=1, max_top2_load=0.5, min_contribution=0.05))
  assert guard().observe(10, _window(load=[0.25, 0.25, 0.25, 0.25])) == []  # 50% on two: not above 0.5
  assert [c.layer for c in guard().observe(10, _window(load=[0.3, 0.3, 0.2, 0.2]))] == ["moe_0"]  # 60% > 50%
  at_default = health.CollapseGuard(_settings(after_step=0, patience=1))
  assert at_default.observe(10, _window(load=[0.3, 0.3, 0.2, 0.2])) == []  # 60% <= 90%
  five = guard()
  assert five.observe_contribution(10, {"moe_0": 0.05}) == []
  assert [c.layer for c in five.observe_contribution(20, {"moe_0": 0.04})] == ["moe_0"]  # 4% < 5%
  summary = five.summary({"layers": {"moe_0": {"relative_perplexity_increase": 0.04}}})
  assert summary["guard"]["min_contribution"] == 0.05 and summary["dead_layers"] == ["moe_0"]
  assert health.judge_health(summary)["dead_layers"] == ["moe_0"]  # read back at 5%, not 1%


# --- judge_health: the recorded thresholds, the load from the log ---------------------------------------------------

def _health_section(worth: float, guard: dict | None = None, layer_values: dict | None = None) -> dict:
  section = {"layers": {"moe_0": layer_values or {"mean_gate": 0.5}},
             "contribution": {"layers": {"moe_0": {"relative_perplexity_increase": worth}}},
             "ok": True, "dead_layers": []}
  if guard is not None:
    section["guard"] = guard
  return section


@pytest.mark.parametrize("worth, dead", [(0.05, False), (0.0499, True), (0.03, True)])
def test_judge_health_uses_the_recorded_min_contribution(worth, dead):
  """At the recorded 5%, a layer worth 3% is dead; at the default 1% it would be alive."""
  judged = health.judge_health(_health_section(worth, {"min_contribution": 0.05, "max_top2_load": 0.9}))
  assert judged["dead_layers"] == (["moe_0"] if dead else [])
  assert health.judge_health(_health_section(worth))["dead_layers"] == []  # no guard section: the defaults


@pytest.mark.parametrize("top2, dead", [(0.5, False), (0.6, True)])
def test_judge_health_uses_the_recorded_max_top2_load(top2, dead):
  values = {"top2_load": top2, "num_experts": 8.0}
  judged = health.judge_health(_health_section(0.1, {"min_contribution": 0.01, "max_top2_load": 0.5}, values))
  assert judged["dead_layers"] == (["moe_0"] if dead else [])
  assert health.judge_health(_health_section(0.1, None, values))["ok"]  # 60% is healthy at the default 90%


def test_judge_health_with_one_recorded_threshold_takes_the_default_for_the_other():
  values = {"top2_load": 0.95, "num_experts": 8.0}
  judged = health.judge_health(_health_section(0.03, {"min_contribution": 0.05}, values))
  assert judged["verdict"]["moe_0"]["reasons"][0].startswith("removing it raises")
  assert "health.max_top2_load=0.9" in judged["verdict"]["moe_0"]["reasons"][1]


def test_judge_health_reads_the_last_logged_load_not_an_earlier_one():
  """The log's last window with a load for every layer missing one decides; a later record without load is
  skipped, an earlier degenerate window is not the verdict."""
  records = [{"step": 800, **_window(load=ONE_EXPERT)}, {"step": 850, **_window(load=BALANCED)},
             {"step": 850, "valid/perplexity": 150.0}]
  assert health.judge_health(_health_section(0.05), records)["ok"]
  records = [{"step": 800, **_window(load=BALANCED)}, {"step": 850, **_window(load=ONE_EXPERT)},
             {"step": 850, "valid/perplexity": 150.0}]
  judged = health.judge_health(_health_section(0.05), records)
  assert judged["dead_layers"] == ["moe_0"] and judged["verdict"]["moe_0"]["top2_load"] == pytest.approx(0.94)


def test_a_logged_load_does_not_replace_the_one_a_summary_recorded():
  values = {"top2_load": 0.3, "num_experts": 8.0}
  assert health.judge_health(_health_section(0.05, None, values), [{"step": 850, **_window(load=ONE_EXPERT)}])["ok"]


# --- the health section's config checks, both sides ------------------------------------------------------------------

@pytest.mark.parametrize("key, value, ok", [
    ("min_contribution", 0.0, True), ("min_contribution", 1.0, True), ("min_contribution", -0.001, False),
    ("max_top2_load", 1.0001, False), ("min_gate_position", 1.0, True), ("min_load_balance", -0.1, False),
    ("patience", 1, True), ("patience", 0, False),
    ("after_step", -1, True), ("after_step", -2, False), ("after_step", 849, True), ("after_step", 850, False),
    ("on_collapse", "stop", True), ("on_collapse", "raise", False),
])
def test_health_config_checks_at_their_bounds(key, value, ok):
  config = _config(**{key: value})  # train.steps = 850
  if ok:
    health.check_config(from_config(config))
  else:
    with pytest.raises(ConfigError, match=f"health.{key}="):
      health.check_config(from_config(config))


# --- health.contribution_batches: the final measure's batches --------------------------------------------------------

class _FakeRun:
  """A ``RunView`` stand-in for :func:`experiment_contributions`: perplexity 150 with the layer, 160 without
  (its expert outputs zeroed); records the batches each evaluation was given. ``section``: the run's ``health``
  section (None: absent, its defaults)."""

  def __init__(self, section):
    self.settings = types.SimpleNamespace(health=typed(HealthSettings, section))
    self.calls = []

  def evaluate(self, params, split, max_batches):
    self.calls.append((split, max_batches))
    zeroed = not np.any(params["moe_0"]["experts"]["w_out"])
    return {"loss": 0.0, "perplexity": 160.0 if zeroed else 150.0, "tokens": 99}


@pytest.mark.parametrize("section, batches, recorded", [({"contribution_batches": 3}, 3, 3), (None, 20, 20),
                                                        ({"contribution_batches": 0}, 0, "all")])
def test_the_final_contribution_reads_contribution_batches(section, batches, recorded):
  run = _FakeRun(section)
  params = {"moe_0": {"experts": {"w_out": np.ones(2), "b_out": np.ones(2), "w_in": np.ones(2)}}, "embed": np.ones(1)}
  result = contribution.experiment_contributions(run, params, "test")
  assert run.calls == [("test", batches), ("test", batches)] and result["batches"] == recorded
  assert result["layers"]["moe_0"]["relative_perplexity_increase"] == pytest.approx(160 / 150 - 1)
  assert result["split"] == "test"


# --- replay up to the checkpoint, and which layers the verdict names -------------------------------------------------

@pytest.mark.parametrize("up_to, dead_at", [(20, [20]), (19, [])])
def test_replay_observes_the_records_up_to_the_checkpoint_and_not_past_it(up_to, dead_at):
  records = [{"step": 10, **_window()}, {"step": 20, **_window(load=ONE_EXPERT)}]
  guard = health.CollapseGuard(_settings(after_step=0, patience=1))
  assert [c.step for c in guard.replay(records, up_to)] == dead_at
  assert guard.observe(30, _window()) == [] and guard.last_window_step == 30


def test_the_verdict_judges_a_layer_known_only_by_its_load_or_only_by_its_contribution():
  section = {"layers": {"moe_0": {"top2_load": 0.95, "num_experts": 8.0}},
             "contribution": {"layers": {"moe_1": {"relative_perplexity_increase": 0.002}}}}
  judged = health.verdict(section)
  assert judged["dead_layers"] == ["moe_0", "moe_1"]
  assert judged["verdict"]["moe_0"]["contribution"] is None and judged["verdict"]["moe_1"]["top2_load"] is None
  assert health.least_contribution(section) == 0.002 and health.least_contribution({"layers": {}}) is None

"""Router health's verdict and its guard: each planted collapse caught on synthetic windows, the gate's attainable
range, patience and warmup, re-judging old summaries, guard replay from the log, warn / stop; and in training on
real data (slow), a run built to collapse stopped in process and from the command line (exit status 2), the default's
first steps passed in silence. ``test_health.py`` has the metrics, the contribution, the config and the comparison's
columns."""
from __future__ import annotations

import math
import os
import re
import subprocess

import jax
import numpy as np
import pytest

from configs import default
from stablemoe_jax.core import errors
from stablemoe_jax.experiment import actions, loop
from stablemoe_jax.experiment.step import make_train_step
from stablemoe_jax.train import health
from stablemoe_jax.train.metrics import read_metrics
from stablemoe_jax.core.settings import from_config


# --- the verdict and the guard on synthetic windows ------------------------------------------------------------------

def _settings(**changes):
  config = default.get_config()
  config.train.warmup_steps = 10
  for key, value in changes.items():
    if key == "router":
      config.model.moe.router = value
    elif key == "affinity":
      config.model.moe.stablemoe.affinity = value
    elif key == "num_experts":
      config.model.moe.num_experts = value
    else:
      config.health[key] = value
  return health.GuardSettings.from_settings(from_config(config))


BALANCED = [0.125] * 8
ONE_EXPERT = [0.93, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01]  # 94% on the two busiest


def _window(gate=0.5, low=0.0, balance=0.9, layer="moe_0", load=BALANCED, temperature=None, **extra):
  window = {f"moe/{layer}/mean_gate": gate, f"moe/{layer}/low_gate_fraction": low,
            f"moe/{layer}/load_balance": balance, f"moe/{layer}/max_load": max(load), f"moe/{layer}/load": load,
            f"moe/{layer}/dropped_fraction": 0.1, f"moe/{layer}/load_entropy": 1.0, "loss": 5.0, **extra}
  if temperature is not None:
    window[f"moe/{layer}/router/router_temperature"] = temperature
  return window


def _sigmoid(x):
  return 1 / (1 + math.exp(-x))


def test_layer_health_reads_the_top_two_load_and_the_cosine_temperature():
  layers = health.layer_health(_window(load=[0.5, 0.1, 0.3, 0.1], temperature=0.4, layer="encoder_moe_1"))
  values = layers["encoder_moe_1"]
  assert list(layers) == ["encoder_moe_1"] and values["top2_load"] == pytest.approx(0.8)
  assert values["num_experts"] == 4 and values["router_temperature"] == 0.4 and values["mean_gate"] == 0.5


def test_gate_range_is_what_each_router_can_reach():
  assert health.gate_range(_settings(affinity="dot"), {}) == (0.0, 1.0)
  low, high = health.gate_range(_settings(affinity="cosine"), {"router_temperature": 0.41})
  assert (low, high) == pytest.approx((_sigmoid(-1 / 0.41), _sigmoid(1 / 0.41)))  # 0.080, 0.920
  assert health.gate_range(_settings(affinity="cosine"), {}) is None  # no temperature logged: no range
  assert health.gate_range(_settings(router="switch", num_experts=32), {}) == (1 / 32, 1.0)
  assert health.gate_range(_settings(router="base"), {}) == (0.0, 1.0)
  assert health.gate_range(_settings(router="hash"), {}) is None
  # The default's cosine gate at 0.178 with tau 0.5: 7.7% of the way up [0.119, 0.881].
  position = health.gate_position(_settings(), {"mean_gate": 0.178, "router_temperature": 0.5})
  assert position == pytest.approx((0.178 - _sigmoid(-2)) / (_sigmoid(2) - _sigmoid(-2)))


# The planted collapses of issue 38: each is caught, whatever the router.
@pytest.mark.parametrize("settings, window, contribution, dead, phrase", [
    # A cosine gate at its floor (tau 0.5: sigmoid(-2) = 0.119): the old "mean gate < 0.05" rule could never fire.
    ({"affinity": "cosine"}, {"gate": _sigmoid(-2) + 0.002, "temperature": 0.5}, None, False,
     "sits 0.3% of the way up the range its router can reach [0.119, 0.881]"),
    ({"affinity": "dot"}, {"gate": 0.0004}, None, False, "sits 0.0% of the way up"),  # a dot gate at 0
    ({}, {"load": ONE_EXPERT}, None, True, "the two busiest of its 8 experts take 94.0% of the tokens"),
    ({"router": "hash"}, {"gate": 1.0, "load": [0.98, 0.02, 0, 0, 0, 0, 0, 0]}, None, True, "degenerate routing"),
    ({}, {}, 0.0, True, "removing it raises validation perplexity by +0.00% < health.min_contribution=0.01"),
    ({"router": "switch"}, {"gate": 0.99}, 0.004, True, "+0.40%"),
])
def test_each_planted_collapse_is_caught(settings, window, contribution, dead, phrase):
  guard = health.CollapseGuard(_settings(patience=1, **settings), start_step=10)
  found = guard.observe(20, _window(**window))
  if contribution is not None:
    found += guard.observe_contribution(20, {"moe_0": contribution})
  assert [c.layer for c in found] == ["moe_0"] and found[0].dead == dead
  assert phrase in found[0].message()
  assert ("is dead at step 20" if dead else "warning") in found[0].message()
  assert (guard.summary()["flagged_in_training"] != {}) == dead


def test_a_sparse_gate_that_does_work_is_alive():
  """BASE's seed 1 at 4e-3 / 400 (results/tune_h100): 61% of gates < 0.01, mean gate 0.37, worth +5.3%. The old
  guard flagged it dead; the verdict keeps it, and so does the in-training guard."""
  guard = health.CollapseGuard(_settings(router="base", patience=1), start_step=10)
  window = _window(gate=0.3705, low=0.617, balance=1.0)
  assert guard.observe(20, window) == [] and guard.observe_contribution(20, {"moe_0": 0.0531}) == []
  contribution_section = {"layers": {"moe_0": {"relative_perplexity_increase": 0.0531}}}
  assert guard.summary(contribution_section)["ok"]
  # Its committed summary, judged again (its own "dead_layers" came from the old rule).
  old = {"health": {"ok": False, "dead_layers": ["moe_0"], "layers": {"moe_0": {"mean_gate": 0.37}},
                    "contribution": contribution_section}}
  assert health.judge_health(old["health"], [{"step": 850, **window}]) == {
      "ok": True, "dead_layers": [], "verdict": {"moe_0": {"dead": False, "reasons": [], "contribution": 0.0531,
                                                          "top2_load": 0.25}}}


def test_judge_health_on_the_thresholds_and_with_the_load_from_the_log():
  def summary(worth):
    return {"layers": {"moe_0": {"mean_gate": 0.5}},
            "contribution": {"layers": {"moe_0": {"relative_perplexity_increase": worth}}}}
  assert health.judge_health(summary(0.01))["ok"]  # on the threshold: alive
  assert health.judge_health(summary(0.0099))["dead_layers"] == ["moe_0"]
  degenerate = health.judge_health(summary(0.05), [{"step": 850, **_window(load=ONE_EXPERT)},
                                                    {"step": 850, "valid/perplexity": 150.0}])
  assert degenerate["dead_layers"] == ["moe_0"] and "degenerate routing" in degenerate["verdict"]["moe_0"]["reasons"][0]
  two_experts = health.judge_health(summary(0.05), [{"step": 850, **_window(load=[0.99, 0.01])}])
  assert two_experts["ok"]  # with 2 experts the rule says nothing
  assert health.judge_health(None) == {"ok": True, "dead_layers": [], "verdict": {}}  # no health section


def test_guard_waits_for_patience_and_the_end_of_the_warmup():
  guard = health.CollapseGuard(_settings(patience=3))  # after_step -1: the warmup, 10 steps
  dead = _window(load=ONE_EXPERT)
  assert guard.observe(10, dead) == []  # steps 1-10: warmup, not counted
  assert guard.observe(20, dead) == [] and guard.observe(30, dead) == []
  found = guard.observe(40, dead)
  assert [c.layer for c in found] == ["moe_0"] and found[0].step == 40
  assert guard.observe(50, dead) == []  # flagged once
  assert guard.summary()["flagged_in_training"]["moe_0"]["step"] == 40
  # A healthy window resets the streak.
  guard = health.CollapseGuard(_settings(patience=2))
  for step, window in ((20, dead), (30, _window()), (40, dead)):
    assert guard.observe(step, window) == []
  assert [c.step for c in guard.observe(50, dead)] == [50]
  # A window that starts inside after_step is not counted, nor an evaluation point at or before it.
  guard = health.CollapseGuard(_settings(patience=1, after_step=15))
  assert guard.observe(10, dead) == [] and guard.observe(20, dead) == [] and len(guard.observe(30, dead)) == 1
  guard = health.CollapseGuard(_settings(after_step=15))
  assert guard.observe_contribution(15, {"moe_0": 0.0}) == [] and len(guard.observe_contribution(16, {"moe_0": 0.0}))


def test_the_final_verdict_is_the_end_of_training_not_an_early_flag():
  guard = health.CollapseGuard(_settings(patience=1), start_step=10)
  assert guard.observe_contribution(425, {"moe_0": 0.003})[0].dead  # worth nothing mid-training ...
  guard.observe(850, _window())
  summary = guard.summary({"layers": {"moe_0": {"relative_perplexity_increase": 0.04}}})  # ... +4% at the end
  assert summary["ok"] and summary["dead_layers"] == [] and summary["flagged_in_training"]["moe_0"]["step"] == 425
  assert summary["contribution"]["layers"]["moe_0"]["relative_perplexity_increase"] == 0.04


def test_guard_never_warns_on_a_hash_gate_or_a_dense_model():
  hash_guard = health.CollapseGuard(_settings(patience=1, router="hash"), start_step=10)
  assert hash_guard.observe(20, _window(gate=1.0, low=0.0, balance=0.95)) == []
  dense_guard = health.CollapseGuard(_settings(patience=1), start_step=10)
  assert dense_guard.observe(20, {"loss": 3.0, "task_loss": 3.0}) == []
  summary = dense_guard.summary({"batches": 20, "layers": {}})
  assert summary["ok"] and summary["dead_layers"] == [] and summary["layers"] == {}
  # Switch's gate is a softmax probability >= 1/N: 0.6 of 8 experts is healthy, 0.13 sits at its floor (0.125).
  switch_guard = health.CollapseGuard(_settings(patience=1, router="switch"), start_step=10)
  assert switch_guard.observe(20, _window(gate=0.6)) == []
  (warning,) = switch_guard.observe(30, _window(gate=0.13))
  assert not warning.dead and "[0.125, 1.000]" in warning.message()


def test_guard_rebuilt_from_the_log_reaches_the_same_verdict_as_the_live_one():
  windows = [(step, _window(load=BALANCED if step < 40 else ONE_EXPERT, gate=0.5 if step < 30 else 0.001))
             for step in range(10, 80, 10)]
  records = [{"step": step, **window} for step, window in windows]
  records.insert(3, {"step": 30, "valid/loss": 4.0, "moe/moe_0/contribution": 0.2})  # an evaluation point
  records.insert(5, {"step": 45, "valid/loss": 4.0, "moe/moe_0/contribution": 0.002})
  live = health.CollapseGuard(_settings(patience=3, affinity="dot"))
  flagged = []
  for record in records:
    flagged += [(c.step, c.dead) for c in live.observe(record["step"], record)]
    flagged += [(c.step, c.dead) for c in live.observe_contribution(record["step"],
                                                                     health.logged_contributions(record))]
  assert flagged == [(45, True), (50, False)]  # dead at the evaluation point, warned at the third low-gate window
  for resume_at in (30, 45, 50, 70):
    resumed = health.CollapseGuard(_settings(patience=3, affinity="dot"), resume_at)
    replayed = resumed.replay(records, resume_at)
    later = []
    for record in records:
      if record["step"] > resume_at:
        later += [(c.step, c.dead) for c in resumed.observe(record["step"], record)]
        later += [(c.step, c.dead) for c in resumed.observe_contribution(record["step"],
                                                                          health.logged_contributions(record))]
    assert [(c.step, c.dead) for c in replayed] + later == flagged
    assert resumed.summary() == live.summary()


def test_warn_prints_one_message_and_stop_raises_only_for_a_dead_layer(capsys):
  guard = health.CollapseGuard(_settings(patience=1), start_step=10)
  collapses = guard.observe_contribution(20, {"moe_1": 0.001})
  actions.handle_collapses(guard, collapses, last_checkpoint=10)
  err = capsys.readouterr().err
  assert err.count("ROUTER HEALTH") == 1 and "MoE layer moe_1" in err and "+0.10%" in err
  stopping = health.CollapseGuard(_settings(patience=1, on_collapse="stop", affinity="dot"), start_step=10)
  actions.handle_collapses(stopping, stopping.observe(20, _window(gate=0.001, layer="moe_1")), 10)  # a warning
  assert "ROUTER HEALTH warning" in capsys.readouterr().err
  with pytest.raises(errors.CollapseError, match=r"moe_1 .*Nothing was saved after the last checkpoint \(step 10\)"):
    actions.handle_collapses(stopping, stopping.observe_contribution(30, {"moe_1": 0.0}), 10)
  assert "No checkpoint was written yet" in health.stop_message(stopping.dead["moe_1"], None)
  from stablemoe_jax import cli
  assert errors.CollapseError in cli.USER_ERRORS  # one line and exit status 2 from python -m stablemoe_jax.main


# --- the guard in training on real data ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_data(prepared_ptb):
  """One prepared copy of the data for this module's runs (runs link their workdir/data to it): the session's."""
  return prepared_ptb


def _workdir(tmp_path, shared_data):
  (tmp_path / "data").symlink_to(shared_data)
  return tmp_path


def _collapsing_config(ptb_dir):
  """A tiny StableMoE built to collapse: the paper's router and balance scope (README "Router health"), the balance loss
  x 3000 and 10x the learning rate, all of it stage 1."""
  from tests.conftest import make_tiny_config
  config = make_tiny_config(ptb_dir)
  config.model.moe.stablemoe.balance_scope = "assigned"
  config.model.moe.stablemoe.affinity, config.model.moe.stablemoe.cosine_dim = "dot", 0  # the paper's routing
  config.model.moe.stablemoe.balance_alpha = 1000.0
  config.train.learning_rate = 0.03
  config.train.steps, config.train.stage1_steps = 16, 16
  config.train.eval_every, config.train.checkpoint_every = 6, 4  # the contribution is measured at steps 6, 12
  config.health.on_collapse = "stop"
  # A tiny layer alive at step 6 is worth about 0.1% (measured); collapsed, nothing: 0.05% tells them apart.
  config.health.min_contribution = 0.0005
  return config


@pytest.mark.slow
def test_stop_ends_a_collapsing_run_with_the_layer_and_its_numbers(ptb_dir, shared_data, tmp_path):
  workdir = _workdir(tmp_path, shared_data)
  with pytest.raises(errors.CollapseError) as raised:
    loop.train_and_evaluate(_collapsing_config(ptb_dir), workdir)
  message = str(raised.value)
  assert "MoE layer moe_0 (router 'stablemoe') is dead at step" in message and "mean_gate 0.0" in message
  assert "removing it raises validation perplexity by" in message
  flagged_at = int(re.search(r"is dead at step (\d+)", message).group(1))
  last_checkpoint = int(re.search(r"Nothing was saved after the last checkpoint \(step (\d+)\)", message).group(1))
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert saved[-1] == last_checkpoint < flagged_at  # checkpoints every 4 steps; none at or after the stop
  # It really collapsed: the last logged window's gates are (almost) all below 0.01; the first were alive.
  logged = [r for r in read_metrics(workdir) if "moe/moe_0/mean_gate" in r]
  assert logged[0]["moe/moe_0/mean_gate"] > 0.3
  assert logged[-1]["moe/moe_0/mean_gate"] < 0.05 and logged[-1]["moe/moe_0/low_gate_fraction"] > 0.5
  # What the layer was worth at the two evaluation points: alive at step 6, nothing once collapsed.
  worth = {r["step"]: r["moe/moe_0/contribution"] for r in read_metrics(workdir) if "moe/moe_0/contribution" in r}
  assert sorted(worth) == [6, 12] and worth[6] >= 0.0005 > worth[12]
  assert not (workdir / "summary.json").exists()


@pytest.mark.slow
def test_guard_is_silent_on_the_defaults_first_steps_where_the_gate_is_alive(ptb_dir, shared_data, tmp_path):
  from tests.conftest import make_tiny_config
  config = make_tiny_config(ptb_dir)  # the default's router, balance loss and warmup, tiny
  config.health.update(patience=1, after_step=0)  # strictest: any single collapsed window would be flagged
  exp = loop.Experiment(config, _workdir(tmp_path, shared_data))
  state = exp.init_state()
  step_fn = jax.jit(make_train_step(exp.model, exp.tx, exp.settings, exp.task))
  batches = exp.train_batches()
  guard = health.CollapseGuard(health.GuardSettings.from_settings(from_config(exp.config)))
  for step in range(1, 13):
    state, metrics = step_fn(state, next(batches))
    window = {k: float(v) for k, v in jax.device_get(metrics).items() if np.ndim(v) == 0}
    assert guard.observe(step, window) == []
    assert window["moe/moe_0/mean_gate"] > 0.3
  exp.checkpointer.close()
  assert guard.summary()["ok"] and guard.summary()["layers"]["moe_0"]["load_balance"] > 0.5


@pytest.mark.slow
def test_stop_on_collapse_exits_with_status_2_from_the_command_line(ptb_dir, shared_data, tmp_path):
  from tests.conftest import MAIN, REPO, tiny_flags
  _workdir(tmp_path, shared_data)
  flags = [*tiny_flags(steps=16, stage1_steps=16, warmup_steps=2, log_every=2, checkpoint_every=4),
           "--config.train.eval_every=6",
           "--config.model.moe.distilled_router.dim=8", "--config.train.learning_rate=0.03",
           "--config.model.moe.stablemoe.balance_scope=assigned", "--config.model.moe.stablemoe.affinity=dot",
           "--config.model.moe.stablemoe.cosine_dim=0", "--config.model.moe.stablemoe.balance_alpha=1000",
           "--config.health.on_collapse=stop", "--config.health.min_contribution=0.0005"]
  result = subprocess.run([*MAIN, "--workdir", str(tmp_path), *flags], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "STABLEMOE_DATA_DIR": str(ptb_dir)}, timeout=600)
  assert result.returncode == 2, result.stderr
  assert "error: ROUTER HEALTH: MoE layer moe_0" in result.stderr and "Traceback" not in result.stderr
  assert "health.on_collapse='stop'" in result.stderr and not (tmp_path / "summary.json").exists()

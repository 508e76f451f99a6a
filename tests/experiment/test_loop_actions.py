"""The loop's clock and its named actions (``experiment/clock.py``, ``experiment/actions.py``): which intervals count
as training time, on a fake clock, by hand; the schedule against the conditions written out; and a tiny run on a
clock where each step takes 1 s and each boundary check or evaluation 1,000 s, killed and resumed."""
from __future__ import annotations

import json

import pytest
from tests.conftest import make_tiny_config, share_prepared_ptb

from stablemoe_jax.core.errors import NonFiniteLossError
from stablemoe_jax.experiment import actions, loop
from stablemoe_jax.experiment.clock import TrainClock
from stablemoe_jax.train import health
from stablemoe_jax.core.settings import from_config


class FakeTime:
  """A wall clock that moves only when told (seconds, exact in float for integers)."""

  def __init__(self, start: float = 100.0):
    self.now = start

  def __call__(self) -> float:
    return self.now

  def advance(self, seconds: float) -> None:
    self.now += seconds


def test_the_clock_counts_running_time_only_and_continues_a_resumed_count():
  wall = FakeTime()
  clock = TrainClock(seconds_before=40.0, now=wall)
  wall.advance(3)
  assert clock.seconds() == 43.0
  with clock.paused():
    wall.advance(500)
    assert clock.seconds() == 43.0  # frozen while paused
  wall.advance(2)
  assert clock.seconds() == 45.0 and clock.wall_seconds() == 505.0
  with clock.paused(), pytest.raises(AssertionError, match="paused already"):
    with clock.paused():
      pass
  assert clock.seconds() == 45.0


@pytest.mark.parametrize("steps,stage1,log,evals,ckpt", [(12, 5, 2, 6, 4), (10, 10, 3, 5, 10), (7, 0, 7, 2, 3)])
def test_the_schedule_is_the_loops_conditions(steps, stage1, log, evals, ckpt):
  schedule = actions.Schedule(steps, stage1, log, evals, ckpt)
  for step in range(1, steps + 1):
    assert schedule.logs(step) == (step % log == 0 or step == steps)
    assert schedule.ends_stage1(step) == (step == stage1 and step != steps)
    assert schedule.evaluates(step) == (step % evals == 0 and step != steps)
    assert schedule.saves(step) == (step % ckpt == 0 or step == steps)


class _Writer:
  def __init__(self):
    self.records = []

  def write(self, step, values):
    self.records.append((step, dict(values)))


class _Progress:
  def set_postfix(self, **_):
    pass


def _run(wall: FakeTime) -> actions.RunRecord:
  clock = TrainClock(now=wall)
  guard = health.CollapseGuard(health.GuardSettings.from_settings(from_config(make_tiny_config("/nowhere"))), 0)
  return actions.RunRecord(evaluate=None, routing_agreement=None, eval_batches=0, checkpointer=None,
                           writer=_Writer(), progress=_Progress(), guard=guard, clock=clock,
                           window=actions.Window(clock), tokens_per_step=64, trained_tokens=10.0,
                           last_checkpoint=None)


def _step_metrics(loss: float) -> dict:
  return {"loss": loss, "task_loss": loss, "stage": 1, "scored_tokens": 60.0}


def test_a_window_spanning_a_pause_counts_its_training_time_only():
  """2 steps of 1 s with a 100 s pause between: 128 tokens in 2 s, whatever the pause (the loop used to restart
  the window after a pause, so this window counted only its second step: 128 tokens/s)."""
  wall = FakeTime()
  run = _run(wall)
  wall.advance(1)
  run.window.add(_step_metrics(2.0))
  with run.clock.paused():
    wall.advance(100)
  wall.advance(1)
  run.window.add(_step_metrics(4.0))
  actions.log_window(run, 2)
  (step, logged), = run.writer.records
  assert step == 2 and logged["tokens_per_second"] == 64.0 and logged["train_seconds"] == 2.0
  assert logged["loss"] == 3.0 and logged["trained_tokens"] == 130.0 == run.trained_tokens
  assert run.window.metrics == [] and run.window.started_at == 2.0
  wall.advance(1)  # the next window starts where this one was logged
  run.window.add(_step_metrics(float("nan")))
  with pytest.raises(NonFiniteLossError, match="step 3"):
    actions.log_window(run, 3)



def test_periodic_work_runs_each_action_at_its_steps_in_order_and_stops_before_the_save(monkeypatch):
  """6 steps (stage 1 ends at 2, logs every 2, evaluates every 3, saves every 4), each step 1 s and each action
  1,000 s: the actions in the loop's order at the schedule's steps, the boundary, evaluation and facts probe off the
  training clock and the log and save on it; with stop_at_step=4, step 4 logs and then stops before its save."""
  wall, calls = FakeTime(), []
  run = _run(wall)
  for name, step_at in (("log_window", 1), ("end_stage1", 1), ("evaluate_and_judge", 1), ("probe_facts", 2),
                        ("save", 1)):
    def action(*args, name=name, step_at=step_at):
      wall.advance(1000)
      calls.append((args[step_at], name))
    monkeypatch.setattr(actions, name, action)
  probe, state = type("Probe", (), {"enabled": True})(), type("State", (), {"params": {}})()
  schedule = actions.Schedule(steps=6, stage1_steps=2, log_every=2, eval_every=3, checkpoint_every=4)
  for step in range(1, 7):
    wall.advance(1)
    for when, act in actions.periodic_work(schedule, run, iter(()), probe):
      if when(step):
        act(step, state, {})
  assert calls == [(2, "log_window"), (2, "end_stage1"), (3, "evaluate_and_judge"), (3, "probe_facts"),
                   (4, "log_window"), (4, "save"), (6, "log_window"), (6, "save")]
  assert run.clock.seconds() == 6 + 5 * 1000  # the 3 logs and 2 saves count, the 3 paused actions do not
  calls.clear()
  with pytest.raises(actions.StopTraining) as stopped:
    for step in range(1, 7):
      for when, act in actions.periodic_work(schedule, run, iter(()), probe, stop_at_step=4):
        if when(step):
          act(step, state, {})
  assert stopped.value.step == 4 and calls[-1] == (4, "log_window") and (4, "save") not in calls

def _fake_timed_run(monkeypatch, wall: FakeTime) -> None:
  """Each train step takes 1 s of ``wall``, each boundary check and evaluation 1,000 s, nothing else any time."""
  monkeypatch.setattr(loop, "TrainClock", lambda seconds_before: TrainClock(seconds_before, now=wall))
  jit_train_step = loop.Experiment.jit_train_step

  def timed_train_step(self):
    step = jit_train_step(self)
    def run(*args):
      wall.advance(1)
      return step(*args)
    return run
  monkeypatch.setattr(loop.Experiment, "jit_train_step", timed_train_step)
  for name in ("end_stage1", "evaluate_and_judge"):
    action = getattr(actions, name)
    def slow(*args, action=action):
      wall.advance(1000)
      return action(*args)
    monkeypatch.setattr(actions, name, slow)


@pytest.mark.slow
def test_train_seconds_leave_out_the_pauses_and_continue_across_a_resumption(
    ptb_dir, prepared_ptb, tmp_path, monkeypatch):
  """The tiny run (12 steps, stage 1 ends at 5, logs every 2, evaluates at 6, saves every 4), killed after step 6
  and resumed from step 4: every window 2 s (64 tokens/s), train_seconds the step number, in the run that was
  killed and in the one that resumed, and the summary's 12 s, as an uninterrupted run's."""
  config = make_tiny_config(ptb_dir)
  share_prepared_ptb(prepared_ptb, tmp_path)
  wall = FakeTime()
  _fake_timed_run(monkeypatch, wall)
  read = lambda: [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert loop.train_and_evaluate(config, tmp_path, stop_at_step=6) == {"stopped_at_step": 6}
  killed = {r["step"]: r["train_seconds"] for r in read() if "train_seconds" in r}
  assert killed == {2: 2.0, 4: 4.0, 6: 6.0}  # step 6: its window and its evaluation, both before the pause
  summary = loop.train_and_evaluate(config, tmp_path)  # resumes at step 4: the boundary and step 6 run again
  windows = [r for r in read() if "loss" in r]
  assert [(r["step"], r["train_seconds"], r["tokens_per_second"]) for r in windows] == [
      (s, float(s), 64.0) for s in (2, 4, 6, 8, 10, 12)]
  evaluation, = [r for r in read() if "valid/loss" in r]
  assert evaluation["step"] == 6 and evaluation["train_seconds"] == 6.0
  assert summary.train_seconds == 12.0 and summary.tokens_per_second == 64.0
  assert summary.train_seconds_this_run == 8.0 + 2000.0  # steps 5-12 and the two pauses, in the resumed run


def test_a_finite_loss_with_a_nan_gradient_is_stopped_before_its_state_is_saved():
  """The step's update is made from its gradient: a NaN gradient norm with a finite loss (seen in a DeepSeek run at
  lr 4e-3, step 400) has already made the parameters NaN, so neither the log window nor the save may pass it."""
  actions.check_finite({"loss": 5.46, "grad_norm": 0.47}, 400, 200)  # finite: passes
  actions.check_finite({"loss": 5.46}, 400, 200)  # no gradient norm recorded: the loss alone
  with pytest.raises(NonFiniteLossError, match=r"gradient norm is nan \(the loss 5.4600 was finite.*last one is step 200"):
    actions.check_finite({"loss": 5.46, "grad_norm": float("nan")}, 400, 200)
  with pytest.raises(NonFiniteLossError, match="training loss is inf at step 400"):
    actions.check_finite({"loss": float("inf"), "grad_norm": float("nan")}, 400, 200)

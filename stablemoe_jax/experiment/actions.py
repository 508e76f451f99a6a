"""What the training loop does between steps, one named action each: log a window, end stage 1, evaluate and
judge, save; at which steps (``Schedule``); and the list of (when, action) entries the loop runs after every step
(``periodic_work``).

Every action reads and writes the run's shared record (``RunRecord``: writer, progress bar, health guard, clock,
the current window, the scored-token count, the last checkpoint). The actions that are not training run with the
clock paused (``TrainClock.paused``).
"""
from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Callable

import jax
import numpy as np
import tqdm

from stablemoe_jax.analysis.contribution import layer_contributions
from stablemoe_jax.core.errors import CollapseError, NonFiniteLossError
from stablemoe_jax.core.settings import TrainSettings
from stablemoe_jax.experiment.clock import TrainClock
from stablemoe_jax.train import health as health_lib
from stablemoe_jax.train.checkpoint import Checkpointer
from stablemoe_jax.train.metrics import MetricWriter
from stablemoe_jax.train.state import TrainState


@dataclasses.dataclass(frozen=True)
class Schedule:
  """At which steps each action runs (from ``config.train``); the last step logs and saves, but is neither
  evaluated nor a stage boundary here: the final evaluations follow the loop."""
  steps: int
  stage1_steps: int
  log_every: int
  eval_every: int
  checkpoint_every: int

  @classmethod
  def from_settings(cls, train: TrainSettings) -> "Schedule":
    return cls(train.steps, train.stage1_steps, train.log_every, train.eval_every, train.checkpoint_every)

  def logs(self, step: int) -> bool:
    """Every ``log_every`` steps and at the last."""
    return step % self.log_every == 0 or step == self.steps

  def ends_stage1(self, step: int) -> bool:
    """At ``stage1_steps``, unless that is the last step (a stage-1-only run)."""
    return step == self.stage1_steps and step != self.steps

  def evaluates(self, step: int) -> bool:
    """Every ``eval_every`` steps but the last."""
    return step % self.eval_every == 0 and step != self.steps

  def saves(self, step: int) -> bool:
    """Every ``checkpoint_every`` steps and at the last."""
    return step % self.checkpoint_every == 0 or step == self.steps


class Window:
  """The step metrics since the last logged window (device values, fetched when the window is logged), and the
  training clock's reading when the window began."""

  def __init__(self, clock: TrainClock):
    self._clock = clock
    self.restart()

  def restart(self) -> None:
    self.metrics: list[dict] = []
    self.started_at = self._clock.seconds()

  def add(self, metrics: dict) -> None:
    self.metrics.append(metrics)

  def scored_tokens(self) -> float:
    """The scored tokens of the window's steps so far (fetches them)."""
    return scored_tokens(jax.device_get(self.metrics))


@dataclasses.dataclass
class RunRecord:
  """What the actions share. ``writer`` is None off the chief process; ``trained_tokens``: the scored training
  tokens (the loss's weights: translation's real target tokens) up to the last logged window, summed over the
  runs this one resumes; ``last_checkpoint``: the step of the last checkpoint saved or resumed from (None: none);
  ``evaluate(params, split, max_batches)`` and ``routing_agreement(params, split, max_batches)``: the run's
  (``loop.Experiment``'s); ``eval_batches``: the in-training evaluations' batches (``train.eval_batches``)."""
  evaluate: Callable[[Any, str, int], dict]
  routing_agreement: Callable[[Any, str, int], float | None]
  eval_batches: int
  checkpointer: Checkpointer | None
  writer: MetricWriter | None
  progress: tqdm.tqdm
  guard: health_lib.CollapseGuard
  clock: TrainClock
  window: Window
  tokens_per_step: int
  trained_tokens: float
  last_checkpoint: int | None


def scored_tokens(window: list[dict]) -> float:
  """The scored tokens of a window's fetched step metrics (0 for a task without loss weights)."""
  return float(sum(m.get("scored_tokens", 0.0) for m in window))


def check_finite(values: dict, step: int, last_checkpoint: int | None) -> None:
  """NonFiniteLossError, naming the checkpoint a rerun resumes from and the settings to change, unless the step
  metrics ``values`` have a finite "loss" and (where present) "grad_norm": a finite loss with a non-finite gradient
  has already made the updated parameters non-finite, so that state must not be saved either."""
  loss, grad_norm = float(values["loss"]), values.get("grad_norm")
  if not math.isfinite(loss):
    what = f"the training loss is {loss}"
  elif grad_norm is not None and not math.isfinite(float(grad_norm)):
    what = (f"the gradient norm is {float(grad_norm)} (the loss {loss:.4f} was finite; the update made the "
            "parameters non-finite)")
  else:
    return
  raise NonFiniteLossError(
      f"{what} at step {step}. No checkpoint was written after it; the last one is step {last_checkpoint}, and "
      f"rerunning resumes there. Lower --config.train.learning_rate, lengthen --config.train.warmup_steps or tighten "
      f"--config.train.clip_norm.", step=step)


def handle_collapses(guard: health_lib.CollapseGuard, collapses: list[health_lib.Collapse],
                     last_checkpoint: int | None, announce: bool = True) -> None:
  """Acts on the guard's new findings: one message each (stderr); a dead layer raises CollapseError with "stop".

  ``announce=False`` (verdicts replayed on resumption): the interrupted run has printed them already.
  """
  for collapse in collapses:
    if collapse.dead and guard.settings.on_collapse == "stop":
      raise CollapseError(health_lib.stop_message(collapse, last_checkpoint))
    if announce and jax.process_index() == 0:
      tqdm.tqdm.write(collapse.message(), file=sys.stderr)


def log_window(run: RunRecord, step: int) -> None:
  """Logs the window's mean step metrics at ``step`` with its tokens/s (on the training clock), the training
  seconds and the scored tokens so far; stops on a non-finite loss, lets the guard judge the window, and starts
  the next window.

  The fetch and the clock reading come first, so the window's time includes waiting for its steps; the
  logging itself counts in ``train_seconds`` but in no window (the next one starts after it).
  """
  window = jax.device_get(run.window.metrics)
  averaged = {k: np.mean([m[k] for m in window], axis=0) for k in window[0]}
  averaged["stage"] = window[-1]["stage"]
  now = run.clock.seconds()
  averaged["tokens_per_second"] = len(window) * run.tokens_per_step / (now - run.window.started_at)
  averaged["train_seconds"] = now
  run.trained_tokens += scored_tokens(window)
  averaged["trained_tokens"] = run.trained_tokens
  check_finite(averaged, step, run.last_checkpoint)
  if run.writer:
    run.writer.write(step, averaged)
  run.progress.set_postfix(loss=f"{averaged['task_loss']:.3f}", stage=int(averaged["stage"]),
                           tok_s=f"{averaged['tokens_per_second']:.0f}", **health_lib.progress_summary(averaged))
  handle_collapses(run.guard, run.guard.observe(step, averaged), run.last_checkpoint)
  run.window.restart()


def end_stage1(run: RunRecord, step: int, params) -> None:
  """The stage-1 boundary: logs how often the distilled router agrees with the learned routing on the first
  ``train.eval_batches`` validation batches (nothing for a model without a distilled router)."""
  agreement = run.routing_agreement(params, "valid", run.eval_batches)
  if run.writer and agreement is not None:
    run.writer.write(step, {"distill_agreement_at_boundary": agreement})
    run.progress.write(f"step {step} (end of stage 1): distilled router agrees with the learned routing on "
                       f"{agreement:.1%} of validation tokens")


def evaluate_and_judge(run: RunRecord, step: int, params) -> None:
  """Validation loss and perplexity on the first ``train.eval_batches`` batches, and what each MoE layer is worth
  on the same batches (the health verdict's contribution rule), logged with the training seconds and the scored
  tokens to this step; the guard then judges the contributions."""
  eval_batches = run.eval_batches
  valid = run.evaluate(params, "valid", eval_batches)
  measured = layer_contributions(lambda p, n: run.evaluate(p, "valid", n), params, eval_batches, full=valid)
  worth = {layer: c["relative_perplexity_increase"] for layer, c in measured["layers"].items()}
  all_layers = measured.get("all_layers", {}).get("relative_perplexity_increase")  # > 1 MoE layer only
  if run.writer:
    run.writer.write(step, {"valid/loss": valid["loss"], "valid/perplexity": valid["perplexity"],
                            **{f"moe/{layer}/contribution": value for layer, value in worth.items()},
                            **({} if all_layers is None else {health_lib.ALL_LAYERS_KEY: all_layers}),
                            "train_seconds": run.clock.seconds(),
                            "trained_tokens": run.trained_tokens + run.window.scored_tokens()})
  run.progress.write(f"step {step}: valid perplexity {valid['perplexity']:.2f}"
                     + "".join(f", {layer} worth {value:+.2%}" for layer, value in worth.items())
                     + ("" if all_layers is None else f", all MoE layers worth {all_layers:+.2%}"))
  handle_collapses(run.guard, run.guard.observe_contribution(step, worth, all_layers), run.last_checkpoint)


def probe_facts(run: RunRecord, probe, step: int, params) -> None:
  """The facts regime's point at ``step`` (``analysis/facts_probe.py``): every fact's recall and route, its
  metrics logged."""
  metrics = probe.measure(params, step)
  if run.writer:
    run.writer.write(step, metrics)
  run.progress.write(f"step {step}: facts recalled {metrics['facts/recall']:.1%}, value NLL "
                     f"{metrics['facts/value_nll']:.3f}")


def save(run: RunRecord, step: int, state: TrainState, metrics: dict, train_iter) -> None:
  """Saves a checkpoint of ``state`` and the position of ``train_iter`` (a grain iterator; async) unless the
  step's ``metrics`` (its loss, its gradient norm) are not finite, first logging the scored tokens a resumption
  from it starts from (when the window has steps).

  The clock runs on: the save's time (starting the async write) counts as training time, as it always has."""
  check_finite(metrics, step, run.last_checkpoint)
  if run.writer and run.window.metrics:
    run.writer.write(step, {"trained_tokens": run.trained_tokens + run.window.scored_tokens()})
  run.checkpointer.save(step, state, train_iter.get_state())
  run.last_checkpoint = step


class StopTraining(Exception):
  """Raised by the ``stop_at_step`` entry of :func:`periodic_work`: the loop returns ``{"stopped_at_step": step}``."""

  def __init__(self, step: int):
    super().__init__(f"stopped at step {step}")
    self.step = step


Action = Callable[[int, TrainState, dict], None]  # (step, the state after it, its metrics) -> None


def periodic_work(schedule: Schedule, run: RunRecord, train_iter, facts_probe=None,
                  stop_at_step: int | None = None) -> list[tuple[Callable[[int], bool], Action]]:
  """The loop's work after each step, as (when, action) entries run in this order where ``when(step)`` holds: log
  the window; end stage 1 and evaluate (the facts probe with it), both with the clock paused; stop at
  ``stop_at_step`` (tests and kill drills: before that step's checkpoint); save."""
  def paused(action: Action) -> Action:
    def run_paused(step: int, state: TrainState, metrics: dict) -> None:
      with run.clock.paused():
        action(step, state, metrics)
    return run_paused

  def evaluate(step: int, state: TrainState, metrics: dict) -> None:
    evaluate_and_judge(run, step, state.params)
    if facts_probe is not None and facts_probe.enabled:
      probe_facts(run, facts_probe, step, state.params)

  def stop(step: int, state: TrainState, metrics: dict) -> None:
    raise StopTraining(step)

  return [
      (schedule.logs, lambda step, state, metrics: log_window(run, step)),
      (schedule.ends_stage1, paused(lambda step, state, metrics: end_stage1(run, step, state.params))),
      (schedule.evaluates, paused(evaluate)),
      (lambda step: step == stop_at_step, stop),
      (schedule.saves, lambda step, state, metrics: save(run, step, state, metrics, train_iter)),
  ]

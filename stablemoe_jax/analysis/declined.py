"""Which tokens a trained MoE layer declines (largest gate < 0.01), and whether its training routing forced them there.

A router with a forced balance (BASE Layer's balanced assignment) puts some tokens on an expert other than their
greedy argmax; its sigmoid gate can then decline them. The collapse guard's low-gate rule counts those declines with
the ones a token's own best expert makes, so a flag on such a router may mean a sparse layer rather than a dead one
(docs/router_health.md). This splits the two; the command is ``stablemoe_jax/commands/declined.py``.

Tokens are routed as in training (stage 1's routing, dropout off) in batches of the training shape
(``train.batch_size`` x ``train.seq_len``: the balanced assignment is per batch), and as at inference. "Forced":
the two disagree (for BASE: the assignment moved the token off its greedy expert; for a router whose training and
inference routing agree, such as Switch or Hash, none is). A top-k router's token is forced when its set of k training
experts differs from its inference set, and declined when its largest gate is under 0.01, as the collapse guard
counts it.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from stablemoe_jax.analysis.report import global_inputs
from stablemoe_jax.analysis.routes import analysis_model, choice_sets_differ, make_declining_router, sorted_layers
from stablemoe_jax.core.run_view import RunView
from stablemoe_jax.models.routing import LOW_GATE


class DeclinedCounts:
  """Running counts of one layer: tokens, forced tokens, declined (gate < LOW_GATE) tokens among each, gate sums."""

  def __init__(self):
    self.tokens = self.forced = self.declined_forced = self.declined_own = 0
    self.gate_sum_forced = self.gate_sum_own = 0.0

  def add(self, train_experts: np.ndarray, gate: np.ndarray, inference_experts: np.ndarray,
          mask: np.ndarray) -> None:
    """One batch: [T, k] training choices (or [T] for top-1), [T] each token's largest training gate, [T, k] (or [T])
    inference choices; ``mask`` [T] true for real tokens. Forced: the two sets of choices differ."""
    moved = choice_sets_differ(train_experts, inference_experts)
    forced, own = moved & mask, ~moved & mask
    declined = gate < LOW_GATE
    self.tokens += int(mask.sum())
    self.forced += int(forced.sum())
    self.declined_forced += int((declined & forced).sum())
    self.declined_own += int((declined & own).sum())
    self.gate_sum_forced += float(gate[forced].sum())
    self.gate_sum_own += float(gate[own].sum())

  def summary(self) -> dict[str, float | int]:
    own = self.tokens - self.forced
    declined = self.declined_forced + self.declined_own
    ratio = lambda a, b: a / b if b else None
    return {"tokens": self.tokens, "forced_fraction": ratio(self.forced, self.tokens),
            "low_gate_fraction": ratio(declined, self.tokens),
            "forced_share_of_low_gates": ratio(self.declined_forced, declined),
            "low_gate_fraction_forced": ratio(self.declined_forced, self.forced),
            "low_gate_fraction_own": ratio(self.declined_own, own),
            "mean_gate_forced": ratio(self.gate_sum_forced, self.forced),
            "mean_gate_own": ratio(self.gate_sum_own, own)}


def declined_tokens(run: RunView, params, split: str = "valid", max_batches: int = 20) -> dict[str, dict]:
  """{layer: DeclinedCounts.summary()} over the first ``max_batches`` batches (<= 0: all) of ``split``, in batches
  of the training shape; layers in model order."""
  train = run.settings.train
  settings = dataclasses.replace(run.settings, eval=dataclasses.replace(run.settings.eval, batch_size=train.batch_size,
                                                                         seq_len=train.seq_len))
  route = jax.jit(make_declining_router(analysis_model(run.task, run.settings.model)))
  counts: dict[str, DeclinedCounts] = {}
  for index, batch in enumerate(run.task.eval_batches(run.data, settings, split)):
    if 0 < max_batches <= index:
      break
    train_choices, gate, inference_choices = jax.device_get(route(params, global_inputs(run, batch)))
    for layer in train_choices:
      _, mask = run.task.routing_tokens(layer, batch)
      counts.setdefault(layer, DeclinedCounts()).add(
          np.asarray(train_choices[layer]), np.asarray(gate[layer], np.float32), np.asarray(inference_choices[layer]),
          np.asarray(mask, bool).reshape(-1))
  if not counts:
    raise ValueError("the model has no MoE layer to analyse (model.moe.enabled is False).")
  return {layer: counts[layer].summary() for layer in sorted_layers(counts)}

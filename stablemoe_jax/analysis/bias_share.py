"""How much of a bias-balanced router's routing its balancing bias decides (DeepSeek-V3's ``expert_bias``).

The router picks its k experts on affinity + bias, and the bias moves after every step to even the load, so the
experts a token gets are partly the affinities' choice and partly the balancing's. This routes a split twice with
the inference routing, as trained and with every bias at 0 (the affinities' own top-k), and counts the real tokens
whose first choice, and whose set of k experts, differ: the routing the bias overrides. The router-side analogue of
BASE Layer's forced tokens (``declined.py``). The command is ``stablemoe_jax/commands/bias_share.py``.

With more than one MoE layer, a later layer's share includes what the earlier layers' changed choices did to its
input; with one (the CPU LM presets) it is that layer's alone.
"""
from __future__ import annotations

import jax
import numpy as np

from stablemoe_jax.analysis.report import global_inputs
from stablemoe_jax.analysis.routes import analysis_model, choice_sets_differ, make_split_router, sorted_layers
from stablemoe_jax.core.run_view import RunView
from stablemoe_jax.models.deepseek_router import split_bias


class OverriddenCounts:
  """Running counts of one layer: real tokens, and those whose first choice / set of k differs without the bias."""

  def __init__(self):
    self.tokens = self.first_changed = self.set_changed = 0

  def add(self, biased: np.ndarray, unbiased: np.ndarray, mask: np.ndarray) -> None:
    """One batch: int [T, k] choices as trained and with the bias at 0 (first first); ``mask`` [T] real tokens."""
    first = biased[:, 0] != unbiased[:, 0]
    every = choice_sets_differ(biased, unbiased)
    self.tokens += int(mask.sum())
    self.first_changed += int((first & mask).sum())
    self.set_changed += int((every & mask).sum())

  def summary(self) -> dict[str, float | int | None]:
    ratio = lambda a: a / self.tokens if self.tokens else None
    return {"tokens": self.tokens, "first_changed_fraction": ratio(self.first_changed),
            "set_changed_fraction": ratio(self.set_changed)}


def bias_overridden_tokens(run: RunView, params, split: str = "valid", max_batches: int = 20) -> dict[str, dict]:
  """{layer: ``OverriddenCounts.summary()`` + ``bias`` [N] and ``bias_spread`` (its max - min)} over the first
  ``max_batches`` evaluation batches (<= 0: all) of ``split``; layers in model order. Raises ValueError when no
  MoE layer has a bias."""
  unbiased_params, biases = split_bias(params)
  if not biases:
    raise ValueError("no MoE layer of this run has a balancing bias (a router parameter `expert_bias`, as "
                     "--config.model.moe.router=deepseek has): there is nothing for this analysis to measure.")
  route = jax.jit(make_split_router(analysis_model(run.task, run.settings.model)))
  counts: dict[str, OverriddenCounts] = {}
  for index, batch in enumerate(run.task.eval_batches(run.data, run.settings, split)):
    if 0 < max_batches <= index:
      break
    inputs = global_inputs(run, batch)
    biased, unbiased = jax.device_get((route(params, inputs), route(unbiased_params, inputs)))
    for layer in biases:
      _, mask = run.task.routing_tokens(layer, batch)
      counts.setdefault(layer, OverriddenCounts()).add(
          np.asarray(biased[layer][0]), np.asarray(unbiased[layer][0]), np.asarray(mask, bool).reshape(-1))
  biases = {layer: np.asarray(jax.device_get(bias), np.float64) for layer, bias in biases.items()}
  return {layer: {**counts[layer].summary(), "bias_spread": float(np.ptp(biases[layer])),
                  "bias": biases[layer].tolist()} for layer in sorted_layers(counts)}

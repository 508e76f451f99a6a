"""DeepSeek-V3's router (DeepSeek-AI, 2024, Section 2.1.2): sigmoid affinities, top-k chosen on affinity + a per-expert
bias, gates = the chosen affinities normalised over the k (without the bias) x ``routed_scale``; the bias balances
the load without an auxiliary loss, moved after every step by ``bias_update_rate * sign(mean load - load_i)``; an
optional small sequence-wise balance loss.

Its settings are the section ``model.moe.deepseek`` (``core.settings.DeepSeekSettings``); ``models/routers.py`` registers it.

The bias is the router's parameter ``expert_bias [N]`` read through ``stop_gradient``: it has no gradient, so Adam
(no weight decay) leaves it exactly as it is, and it is saved, restored and resumed with the other parameters. The
train step moves it after the optimizer update, through the registry's post-update hook (:func:`bias_update_hook`),
from the step's per-expert load of that layer (its ``MoEStats.load``, logged as ``moe/<layer>/load``: each expert's
share of the step's T * k choices, mean 1 / N).
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.core.settings import ModelSettings
from stablemoe_jax.models.routing import MoEStats, Routing, RouterLosses, RouterStats, masked_mean

BIAS = "expert_bias"
ROUTER_MODULE = "router"


def sequence_balance_loss(log_affinity: jax.Array, expert_index: jax.Array, sequences: int,
                          weights: jax.Array | None = None) -> jax.Array:
  """DeepSeek-V3's sequence-wise balance loss without its weight: the mean over sequences of ``sum_i f_i P_i``.

  Per sequence of S tokens: ``f_i = N / (k S) * #(tokens choosing i)`` (no gradient), ``P_i`` the mean over its
  tokens of the normalised affinity ``a_{t,i} / sum_j a_{t,j}``, taken as a softmax of ``log a`` (see
  :class:`DeepSeekRouter`); 1 when uniform. log_affinity float32 [T, N] (``log_sigmoid`` of the logits),
  expert_index int32 [T, k], weights float32 [T] or None (padding counts nowhere) -> scalar.
  """
  tokens, num_experts = log_affinity.shape
  top_k = expert_index.shape[1]
  chosen = jnp.sum(jax.nn.one_hot(expert_index, num_experts, dtype=jnp.float32), axis=1)  # [T, N]
  normalised = jax.nn.softmax(log_affinity, axis=-1)
  w = jnp.ones((tokens,), jnp.float32) if weights is None else weights
  w = w.reshape(sequences, -1, 1)
  count = jnp.maximum(jnp.sum(w, axis=1), 1.0)  # [B, 1] real tokens a sequence
  f = jax.lax.stop_gradient(jnp.sum(chosen.reshape(sequences, -1, num_experts) * w, axis=1)) * num_experts / (
      top_k * count)
  p = jnp.sum(normalised.reshape(sequences, -1, num_experts) * w, axis=1) / count
  return jnp.mean(jnp.sum(f * p, axis=-1))


class DeepSeekRouter(nn.Module):
  """Sigmoid affinities ``a = sigmoid(h E^T)``, top-k on ``a + b`` (b the per-expert bias, no gradient), gates
  ``routed_scale * a_chosen / sum(a_chosen)`` [T, k], the k choices most preferred first.

  The ratio is computed as a softmax of ``log_sigmoid`` over the k: the same value, but ``a / sum(a)`` has a
  non-finite gradient once the chosen logits fall below about -50 (``sum(a)^2`` underflows) under a finite loss,
  which is how a DeepSeek top-2 run at lr 4e-3 diverged."""

  num_experts: int
  top_k: int = 2
  routed_scale: float = 1.0
  balance_weight: float = 0.0
  centroid_gain: float = 0.1

  @nn.compact
  def __call__(self, h: jax.Array, token_ids: jax.Array, in_stage1: jax.Array,
               deterministic: bool = True, token_mask: jax.Array | None = None) -> Routing:
    del in_stage1, deterministic
    centroids = self.param("centroids", nn.initializers.orthogonal(self.centroid_gain),
                           (self.num_experts, h.shape[-1]), jnp.float32)
    bias = jax.lax.stop_gradient(self.param(BIAS, nn.initializers.zeros, (self.num_experts,), jnp.float32))
    logits = h.astype(jnp.float32) @ centroids.T  # [T, N]
    affinity = jax.nn.sigmoid(logits)
    log_affinity = jax.nn.log_sigmoid(logits)
    expert_index = jax.lax.top_k(jax.lax.stop_gradient(affinity) + bias, self.top_k)[1].astype(jnp.int32)
    gate = self.routed_scale * jax.nn.softmax(jnp.take_along_axis(log_affinity, expert_index, axis=-1), axis=-1)
    losses = RouterLosses()
    if self.balance_weight > 0:
      sequences = token_ids.shape[0] if token_ids.ndim == 2 else 1
      losses = RouterLosses(balance=self.balance_weight * sequence_balance_loss(
          log_affinity, expert_index, sequences, token_mask))
    stats = RouterStats(bias_spread=jnp.max(bias) - jnp.min(bias),
                        mean_affinity=masked_mean(jnp.mean(affinity, axis=-1), token_mask))
    return Routing(expert_index=expert_index, gate=gate, losses=losses, stats=stats)


def build(settings, *, moe, num_experts: int, vocab_size: int) -> nn.Module:
  """The router of ``model.moe.deepseek`` (``settings``), named "router"."""
  del moe, vocab_size
  return DeepSeekRouter(num_experts=num_experts, top_k=int(settings.top_k), routed_scale=float(settings.routed_scale),
                        balance_weight=float(settings.balance_weight), centroid_gain=float(settings.centroid_gain),
                        name=ROUTER_MODULE, parent=None)


def top_k(settings) -> int:
  return int(settings.top_k)


def updated_bias(bias: jax.Array, load: jax.Array, rate: float) -> jax.Array:
  """``b_i + rate * sign(mean(load) - load_i)``: an expert below the mean load gains, one above it loses."""
  return bias + rate * jnp.sign(jnp.mean(load) - load)


def _bias_layer(path) -> str | None:
  """The MoE layer path ("/"-joined module names) of a parameter's tree path if it is a router's bias, else None."""
  names = [key.key for key in path if isinstance(key, jax.tree_util.DictKey)]
  return "/".join(names[:-2]) if names[-2:] == [ROUTER_MODULE, BIAS] else None


def bias_update_hook(model: ModelSettings) -> Callable | None:
  """The train step's post-update hook: ``(params, stats) -> params`` with every MoE layer's ``router/expert_bias``
  moved by :func:`updated_bias` from that step's load of the layer (``stats``: {layer path: its ``MoEStats``});
  None when the rate is 0."""
  rate = float(model.moe.deepseek.bias_update_rate)
  if rate == 0:
    return None

  def hook(params, stats: dict[str, MoEStats] | None = None):
    if stats is None:
      return params

    def move(path, leaf):
      layer = _bias_layer(path)
      return leaf if layer is None else updated_bias(leaf, stats[layer].load, rate).astype(leaf.dtype)
    return jax.tree_util.tree_map_with_path(move, params)

  return hook


def split_bias(params) -> tuple[dict, dict[str, jax.Array]]:
  """``(params with every MoE layer's router/expert_bias at 0, {layer path: its bias [N]})``: the routing the
  affinities alone would choose, and the bias that moved it. ``params``: a model's parameter tree (nested dicts);
  a layer path joins the module names above ``router`` with "/"; no bias: the tree unchanged and ``{}``."""
  biases: dict[str, jax.Array] = {}

  def zero(path, leaf):
    layer = _bias_layer(path)
    if layer is None:
      return leaf
    biases[layer] = leaf
    return jnp.zeros_like(leaf)

  return jax.tree_util.tree_map_with_path(zero, params), biases


def check(s, moe) -> list[str]:
  """The problems of the section ``model.moe.deepseek``, one message each."""
  problems = []
  k = s.top_k
  if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= moe.num_experts:
    problems.append(f"model.moe.deepseek.top_k={k!r} must be an integer in [1, model.moe.num_experts="
                    f"{moe.num_experts}] (DeepSeek-V3: 8 of 256).")
  for key, meaning in (("bias_update_rate", "the bias step gamma; 0: no balancing"),
                       ("balance_weight", "the sequence-wise balance loss; 0: off"),
                       ("centroid_gain", "orthogonal-init gain of the centroids")):
    if getattr(s, key) < 0:
      problems.append(f"model.moe.deepseek.{key}={getattr(s, key)} must be >= 0 ({meaning}).")
  if not s.routed_scale > 0:
    problems.append(f"model.moe.deepseek.routed_scale={s.routed_scale} must be > 0 (the gates' scale; 1: none).")
  return problems

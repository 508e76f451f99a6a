"""Switch Transformer's router (Fedus et al., 2022): greedy top-1 on softmax probabilities, gate = that probability,
the load-balancing loss ``N * sum_i f_i P_i`` (optional z-loss and input jitter); with ``fixed_routing=True``
StableMoE's two stages (Table 5).

``top_k = k > 1`` (GShard / Mixtral): softmax over all N logits, the k most probable experts, their k probabilities
renormalised to sum to 1 (Mixtral's convention) as the gates; the balance loss takes f_i over all T * k choices.

Its settings are the section ``model.moe.switch`` (``core.settings.SwitchSettings``); ``models/routers.py`` registers it.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.core.settings.routers import COSINE_KEYS
from stablemoe_jax.models.cosine_routing import check_affinity_keys, cosine_kwargs
from stablemoe_jax.models.learned_router import LearnedRouter, two_stage_kwargs
from stablemoe_jax.models.routing import masked_mean, router_z_loss

# The cosine keys (X-MoE's routing, designed for a softmax top-k router), off by default.
PRESET_KEYS = COSINE_KEYS  # keys a preset may change while another router is chosen


def switch_balance_loss(probs: jax.Array, assignment: jax.Array, weights: jax.Array | None = None) -> jax.Array:
  """Switch Transformer's load-balancing loss ``N * sum_i f_i * P_i``.

  f_i: fraction of the T tokens assigned to expert i (no gradient); P_i: mean router
  probability of expert i. probs float32 [T, N], assignment int32 [T], weights float32 [T] or None
  (the real tokens, over which f and P are taken) -> scalar (1 when uniform).

  Top-k (assignment [T, k]): f_i is the fraction of the T * k choices that went to expert i (each token's k
  choices count 1/k each), so f still sums to 1 and the loss is 1 when uniform.
  """
  num_experts = probs.shape[-1]
  token_weights = None if weights is None else weights[:, None]
  if assignment.ndim == 2:
    chosen = jnp.mean(jax.nn.one_hot(assignment, num_experts, dtype=jnp.float32), axis=1)  # [T, N], rows sum to 1
  else:
    chosen = jax.nn.one_hot(assignment, num_experts, dtype=jnp.float32)
  fraction = masked_mean(chosen, token_weights, axis=0)
  return num_experts * jnp.sum(jax.lax.stop_gradient(fraction) * masked_mean(probs, token_weights, axis=0))


@dataclasses.dataclass(frozen=True)
class SwitchSoftmax:
  """Switch: greedy top-1 on softmax(s), gate = the chosen probability, weighted balance loss and z-loss.

  ``top_k > 1``: the k most probable experts [T, k] (most probable first), gates = their probabilities divided by
  the sum of the k (Mixtral).
  """

  balance_weight: float = 0.01
  z_loss_weight: float = 0.0
  top_k: int = 1

  def assign(self, scores, deterministic, needed=True):
    del deterministic, needed
    if self.top_k == 1:
      return jnp.argmax(scores, axis=-1).astype(jnp.int32), {}
    return jax.lax.top_k(scores, self.top_k)[1].astype(jnp.int32), {}

  def gate(self, scores, expert_index):
    probs = jax.nn.softmax(scores, axis=-1)
    if expert_index.ndim == 1:
      return jnp.take_along_axis(probs, expert_index[:, None], axis=-1)[:, 0]
    chosen = jnp.take_along_axis(probs, expert_index, axis=-1)  # [T, k]
    return chosen / jnp.sum(chosen, axis=-1, keepdims=True)

  def losses(self, scores, assignment, weights=None):
    losses = {"balance": self.balance_weight * switch_balance_loss(
        jax.nn.softmax(scores, axis=-1), assignment, weights)}
    if self.z_loss_weight > 0:
      losses["z_loss"] = self.z_loss_weight * router_z_loss(scores, weights)
    return losses


def top_k(settings) -> int:
  """The experts each token is routed to (1: Switch)."""
  return int(settings.top_k)


def build(settings, *, moe, num_experts: int, vocab_size: int) -> nn.Module:
  """The router of ``model.moe.switch`` (``settings``), named "router"."""
  policy = SwitchSoftmax(settings.balance_weight, settings.z_loss_weight, top_k(settings))
  return LearnedRouter(num_experts=num_experts, policy=policy,
                       vocab_size=vocab_size, centroid_gain=0.0, jitter=settings.jitter, **cosine_kwargs(settings),
                       **two_stage_kwargs(settings, moe, 0.1), name="router", parent=None)


def check(s, moe) -> list[str]:
  """The problems of the section ``model.moe.switch``, one message each."""
  problems = [f"model.moe.switch.{k}={getattr(s, k)} must be >= 0." for k in ("balance_weight", "z_loss_weight")
              if getattr(s, k) < 0]
  if not 0 <= s.jitter < 1:
    problems.append(f"model.moe.switch.jitter={s.jitter} must lie in [0, 1) (0 turns it off).")
  k = s.top_k
  if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= moe.num_experts:
    problems.append(f"model.moe.switch.top_k={k!r} must be an integer in [1, model.moe.num_experts="
                    f"{moe.num_experts}] (1: Switch; 2: GShard / Mixtral).")
  elif k > 1 and s.fixed_routing:
    problems.append(f"model.moe.switch.top_k={k} needs model.moe.switch.fixed_routing=False: the distilled router "
                    f"routes each token to one expert; set --config.model.moe.switch.top_k=1 or drop fixed_routing.")
  return problems + check_affinity_keys("switch", s)

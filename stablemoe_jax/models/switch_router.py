"""Switch Transformer's router (Fedus et al., 2022): greedy top-1 on softmax probabilities, gate = that probability,
the load-balancing loss ``N * sum_i f_i P_i`` (optional z-loss and input jitter); with ``fixed_routing=True``
StableMoE's two stages (Table 5).

Its settings are the section ``model.moe.switch`` (``DEFAULTS``); ``models/routers.py`` registers it.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.models.cosine_routing import COSINE_DEFAULTS, check_affinity_keys, cosine_kwargs
from stablemoe_jax.models.learned_router import LearnedRouter, two_stage_kwargs
from stablemoe_jax.models.routing import masked_mean, router_z_loss

# The paper's settings; the cosine keys (X-MoE's routing, designed for a softmax top-k router) are off here.
DEFAULTS = dict(balance_weight=0.01, z_loss_weight=0.0, jitter=0.0, fixed_routing=False, **COSINE_DEFAULTS)
PRESET_KEYS = tuple(COSINE_DEFAULTS)  # keys a preset may change while another router is chosen


def switch_balance_loss(probs: jax.Array, assignment: jax.Array, weights: jax.Array | None = None) -> jax.Array:
  """Switch Transformer's load-balancing loss ``N * sum_i f_i * P_i``.

  f_i: fraction of the T tokens assigned to expert i (no gradient); P_i: mean router
  probability of expert i. probs float32 [T, N], assignment int32 [T], weights float32 [T] or None
  (the real tokens, over which f and P are taken) -> scalar (1 when uniform).
  """
  num_experts = probs.shape[-1]
  token_weights = None if weights is None else weights[:, None]
  fraction = masked_mean(jax.nn.one_hot(assignment, num_experts, dtype=jnp.float32), token_weights, axis=0)
  return num_experts * jnp.sum(jax.lax.stop_gradient(fraction) * masked_mean(probs, token_weights, axis=0))


@dataclasses.dataclass(frozen=True)
class SwitchSoftmax:
  """Switch: greedy top-1 on softmax(s), gate = the chosen probability, weighted balance loss and z-loss."""

  balance_weight: float = 0.01
  z_loss_weight: float = 0.0

  def assign(self, scores, deterministic, needed=True):
    del deterministic, needed
    return jnp.argmax(scores, axis=-1).astype(jnp.int32), {}

  def gate(self, scores, expert_index):
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.take_along_axis(probs, expert_index[:, None], axis=-1)[:, 0]

  def losses(self, scores, assignment, weights=None):
    losses = {"balance": self.balance_weight * switch_balance_loss(
        jax.nn.softmax(scores, axis=-1), assignment, weights)}
    if self.z_loss_weight > 0:
      losses["z_loss"] = self.z_loss_weight * router_z_loss(scores, weights)
    return losses


def build(settings, *, moe_config, num_experts: int, vocab_size: int) -> nn.Module:
  """The router of ``model.moe.switch`` (``settings``), named "router"."""
  return LearnedRouter(num_experts=num_experts, policy=SwitchSoftmax(settings.balance_weight, settings.z_loss_weight),
                       vocab_size=vocab_size, centroid_gain=0.0, jitter=settings.jitter, **cosine_kwargs(settings),
                       **two_stage_kwargs(settings, moe_config, 0.1), name="router")


def check(s, moe_config) -> list[str]:
  """The problems of the section ``model.moe.switch``, one message each."""
  del moe_config
  problems = [f"model.moe.switch.{k}={s[k]} must be >= 0." for k in ("balance_weight", "z_loss_weight") if s[k] < 0]
  if not 0 <= s.jitter < 1:
    problems.append(f"model.moe.switch.jitter={s.jitter} must lie in [0, 1) (0 turns it off).")
  return problems + check_affinity_keys("switch", lambda key: s.get(key, DEFAULTS[key]))

"""StableMoE's router (Dai et al., 2022, Sections 3.1-3.3): greedy top-1 on the centroid affinities, a sigmoid gate,
the balance loss, always two-staged (the learned assignment distilled into a token-id-only router, then frozen).

Its settings are the section ``model.moe.stablemoe`` (``core.settings.StableMoESettings``); ``models/routers.py`` registers it.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.core.settings.routers import COSINE_KEYS
from stablemoe_jax.models.cosine_routing import check_affinity_keys, cosine_kwargs
from stablemoe_jax.models.learned_router import DistilledRouterSpec, LearnedRouter, distilled_spec
from stablemoe_jax.models.routing import BALANCE_SCOPES, router_z_loss, stablemoe_balance_loss

# Keys a preset may change while another router is chosen (``RouterEntry.preset_keys``): z_loss_weight and the
# cosine keys are deviations, balance_scope="all" one too (their absent values are the paper's).
PRESET_KEYS = ("balance_scope", "z_loss_weight", *COSINE_KEYS)


@dataclasses.dataclass(frozen=True)
class GreedySigmoid:
  """A policy has ``assign(scores [T, N], deterministic, needed) -> (int32 [T], metrics)`` (``needed``: bool
  scalar, false where only a cheap stand-in is wanted), ``gate(scores, index) -> [T]``
  and ``losses(scores, assignment, weights) -> {name: scalar}`` (``weights`` float32 [T] or None: the
  real tokens, over which the losses are taken).

  This one is StableMoE stage 1: greedy top-1, gate ``sigmoid(s[t, e_t])``, balance loss weighted by
  ``balance_alpha`` over the gates of ``balance_scope`` (see ``routing.stablemoe_balance_loss``), and, if
  ``z_loss_weight`` > 0 (a deviation; the paper has none), the router z-loss on the scores.
  """

  balance_alpha: float = 0.3
  balance_scope: str = "assigned"
  z_loss_weight: float = 0.0

  def assign(self, scores, deterministic, needed=True):
    del deterministic, needed
    return jnp.argmax(scores, axis=-1).astype(jnp.int32), {}

  def gate(self, scores, expert_index):
    return jax.nn.sigmoid(jnp.take_along_axis(scores, expert_index[:, None], axis=-1)[:, 0])

  def losses(self, scores, assignment, weights=None):
    losses = {"balance": stablemoe_balance_loss(scores, assignment, self.balance_alpha, self.balance_scope, weights)}
    if self.z_loss_weight > 0:
      losses["z_loss"] = self.z_loss_weight * router_z_loss(scores, weights)
    return losses


def StableMoERouter(num_experts: int, vocab_size: int, distill_dim: int = 50, balance_alpha: float = 0.3,  # noqa: N802
                    distill_weight: float = 1.0, centroid_gain: float = 0.1,
                    distilled: DistilledRouterSpec | None = None, name: str | None = None,
                    balance_scope: str = "assigned", z_loss_weight: float = 0.0, affinity: str = "dot",
                    cosine_dim: int = 0, cosine_temperature: float = 0.5,
                    cosine_expert_norm: float = 0.0, **module_kwargs) -> LearnedRouter:
  """StableMoE (Dai et al., 2022, Sections 3.1-3.3) = the greedy-sigmoid router with its balance loss, two-staged.

  Stage 1: greedy top-1 on ``s = h E^T``, gate ``sigmoid(s[t, a_t])``, balance + distillation losses.
  Stage 2 and inference: the distilled router's argmax; the gate still uses E.
  ``module_kwargs``: Flax's (e.g. ``parent=None`` for a router built to be passed into a MoE layer).
  """
  distilled = distilled or DistilledRouterSpec(dim=distill_dim, centroid_gain=centroid_gain)
  return LearnedRouter(num_experts=num_experts, policy=GreedySigmoid(balance_alpha, balance_scope, z_loss_weight),
                       vocab_size=vocab_size, distilled=distilled, distill_weight=distill_weight,
                       centroid_gain=centroid_gain, affinity=affinity, cosine_dim=cosine_dim,
                       cosine_temperature=cosine_temperature, cosine_expert_norm=cosine_expert_norm, name=name,
                       **module_kwargs)


def build(settings, *, moe, num_experts: int, vocab_size: int) -> nn.Module:
  """The router of ``model.moe.stablemoe`` (``settings``), named "router"."""
  return StableMoERouter(num_experts, vocab_size, balance_alpha=settings.balance_alpha,
                         balance_scope=settings.balance_scope,
                         z_loss_weight=settings.z_loss_weight, **cosine_kwargs(settings),
                         distill_weight=moe.distilled_router.distill_weight,
                         centroid_gain=settings.centroid_gain,
                         distilled=distilled_spec(moe, settings.centroid_gain), name="router", parent=None)


def check(s, moe) -> list[str]:
  """The problems of the section ``model.moe.stablemoe``, one message each."""
  del moe
  get = lambda key: getattr(s, key)
  problems = [f"model.moe.stablemoe.{k}={get(k)} must be >= 0 (0 turns it off)." for k in
              ("balance_alpha", "centroid_gain", "z_loss_weight") if get(k) < 0]
  scope = get("balance_scope")
  if scope not in BALANCE_SCOPES:
    problems.append(f"model.moe.stablemoe.balance_scope={scope!r} is unknown; choose 'assigned' (the paper's "
                    f"Eq. 3) or 'all' (every token's gate; keeps the gate alive at small scale, README "
                    f"'Router health').")
  return problems + check_affinity_keys("stablemoe", s)

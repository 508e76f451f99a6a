"""The learned router: affinities to per-expert centroids, a policy, and optionally StableMoE's two stages.

``LearnedRouter`` scores token t against expert i (``s = h E^T`` float32, or X-MoE's cosine affinity,
``cosine_routing.py``) and hands the scores [T, N] to a *policy* (``stablemoe_router.GreedySigmoid``,
``switch_router.SwitchSoftmax``, ``base_router.BalancedAssignment``) that turns them into an assignment, a gate and
losses. With a distilled router (``DistilledRouterSpec``) it runs StableMoE's two stages: distil the learned
assignment into a token-id-only router during ``train.stage1_steps``, then route by that frozen router.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.models import distill
from stablemoe_jax.models.cosine_routing import AFFINITIES, cosine_affinities, xmoe_expert_init
from stablemoe_jax.models.routing import Routing, RouterLosses, RouterStats, masked_mean

@dataclasses.dataclass(frozen=True)
class DistilledRouterSpec:
  """The shared section ``model.moe.distilled_router`` as a hashable value (see ``distill.make_distilled_router``)."""

  kind: str = "embedding"
  dim: int = 50
  kernel_size: int = 3
  num_layers: int = 1
  num_heads: int = 2
  centroid_gain: float = 0.1

  @classmethod
  def from_config(cls, section, centroid_gain: float = 0.1) -> "DistilledRouterSpec":
    return cls(kind=section.kind, dim=section.dim, kernel_size=section.kernel_size, num_layers=section.num_layers,
               num_heads=section.num_heads, centroid_gain=centroid_gain)


def distilled_spec(moe: settings_lib.MoESettings, centroid_gain: float = 0.1) -> DistilledRouterSpec:
  """The shape of the distilled router of ``moe.distilled_router``."""
  return DistilledRouterSpec.from_config(moe.distilled_router, centroid_gain)


def two_stage_kwargs(settings, moe: settings_lib.MoESettings, centroid_gain: float) -> dict:
  """``LearnedRouter``'s two-stage keywords for a router with ``fixed_routing`` (Table 5: switch, base); {} without."""
  if not settings.fixed_routing:
    return {}
  return dict(distilled=distilled_spec(moe, centroid_gain), distill_weight=moe.distilled_router.distill_weight)


class LearnedRouter(nn.Module):
  """Centroid affinities + a policy, optionally wrapped in StableMoE's two stages.

  Single stage (``distilled is None``): the policy's assignment in every step.
  Two stages: while ``in_stage1``, the policy's assignment, its losses, and a
  distillation loss (cross-entropy of the distilled router's logits against that
  assignment, weight ``distill_weight``) teaching the token-id-only router under
  ``distilled_router``; afterwards (and at inference) the distilled router's
  argmax, with no loss. The optimizer freezes ``distilled_router`` at the
  boundary. The gate always comes from the centroids, which keep learning.

  Attributes:
    num_experts: N.
    policy: GreedySigmoid | SwitchSoftmax | BalancedAssignment (or any object with the same methods). Its
      ``assign`` returns int32 [T] (top-1) or [T, k] (top-k, highest-ranked first) and {name: metric} (fields of
      ``RouterStats``), its ``gate`` the shape of the assignment, its ``losses`` {name: loss} (fields of
      ``RouterLosses``); a top-k policy has no distilled router (``distilled`` None).
    vocab_size: vocabulary size (for the distilled router).
    distilled: the distilled router, or None for single-stage routing.
    distill_weight: weight of the distillation loss.
    centroid_gain: orthogonal-init gain of the centroids (0 -> Switch's truncated normal, scale 0.1).
    jitter: multiplicative input noise ``U(1 - jitter, 1 + jitter)`` on h in training (needs a 'dropout' rng).
    affinity: "dot" (``s = h E^T``) or "cosine" (X-MoE: ``s = cos(P h, E) * exp(logit_scale)``, P a
      bias-free projection to ``cosine_dim`` dimensions (none if 0), the learned ``logit_scale`` = log(1/tau)
      starting at log(1/``cosine_temperature``) and clipped at log(MAX_LOGIT_SCALE)).
    cosine_expert_norm: with affinity "cosine", r > 0 initialises the centroids as X-MoE does (orthogonal, rows
      of norm r; ``cosine_routing.xmoe_expert_init``, replacing ``centroid_gain``'s init), and the train step keeps
      them at norm r (``cosine_routing.expert_norm_hook``); 0: neither.
  """

  num_experts: int
  policy: Any
  vocab_size: int = 0
  distilled: DistilledRouterSpec | None = None
  distill_weight: float = 1.0
  centroid_gain: float = 0.1
  jitter: float = 0.0
  affinity: str = "dot"
  cosine_dim: int = 0
  cosine_temperature: float = 0.5
  cosine_expert_norm: float = 0.0

  @nn.compact
  def __call__(self, h: jax.Array, token_ids: jax.Array, in_stage1: jax.Array,
               deterministic: bool = True, token_mask: jax.Array | None = None) -> Routing:
    """h [T, d], token_ids int32 [B, S] or [T], in_stage1 bool scalar, token_mask float32 [T] or None
    -> Routing over T tokens."""
    if self.affinity not in AFFINITIES:
      raise ValueError(f"router affinity {self.affinity!r} is unknown; choose one of {AFFINITIES}.")
    cosine = self.affinity == "cosine"
    if cosine and self.cosine_expert_norm > 0:
      init = xmoe_expert_init(self.cosine_expert_norm)
    elif self.centroid_gain > 0:
      init = nn.initializers.orthogonal(self.centroid_gain)
    else:
      init = nn.initializers.variance_scaling(0.1, "fan_in", "truncated_normal", in_axis=-1, out_axis=-2)
    feature_dim = self.cosine_dim if cosine and self.cosine_dim > 0 else h.shape[-1]
    centroids = self.param("centroids", init, (self.num_experts, feature_dim), jnp.float32)
    h = h.astype(jnp.float32)
    if self.jitter > 0 and not deterministic:
      h = h * jax.random.uniform(self.make_rng("dropout"), h.shape, jnp.float32, 1 - self.jitter, 1 + self.jitter)
    stats = {}
    if cosine:
      scores, stats["router_temperature"] = cosine_affinities(self, h, centroids, self.cosine_dim,
                                                               self.cosine_temperature)
    else:
      scores = h @ centroids.T  # [T, N]
    learned, policy_metrics = self.policy.assign(
        scores, deterministic, needed=True if self.distilled is None else jnp.asarray(in_stage1))
    stats.update(policy_metrics)
    losses = self.policy.losses(scores, learned, token_mask)
    expert_index = learned
    if self.distilled is not None:
      logits = distill.make_distilled_router(
          self.distilled, self.vocab_size, self.num_experts, name=distill.DISTILLED_ROUTER_NAME)(token_ids)
      distilled = jnp.argmax(logits, axis=-1)
      expert_index = jnp.where(in_stage1, learned, distilled).astype(jnp.int32)
      stage1 = jnp.asarray(in_stage1, jnp.float32)
      target = jax.lax.stop_gradient(learned)
      distill_loss = -masked_mean(
          jnp.take_along_axis(jax.nn.log_softmax(logits), target[:, None], axis=-1)[:, 0], token_mask)
      losses = {name: stage1 * value for name, value in losses.items()}
      losses["distill"] = stage1 * self.distill_weight * distill_loss
      stats["distill_loss"] = distill_loss
      stats["distill_accuracy"] = masked_mean((distilled == learned).astype(jnp.float32), token_mask)
      # Routing analysis: share of tokens routed elsewhere than the centroids' argmax (0 in stage 1 for StableMoE).
      greedy = jnp.argmax(scores, axis=-1)
      stats["centroid_disagreement"] = masked_mean((expert_index != greedy).astype(jnp.float32), token_mask)
    gate = self.policy.gate(scores, expert_index)
    if expert_index.ndim == 1:  # a top-1 policy
      expert_index, gate = expert_index[:, None], gate[:, None]
    return Routing(expert_index=expert_index, gate=gate, losses=RouterLosses(**losses), stats=RouterStats(**stats))

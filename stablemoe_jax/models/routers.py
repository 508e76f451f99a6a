"""Routing methods. Each is a Flax module ``(h [T, d], token_ids [T], in_stage1) -> Routing``.

A new routing method is one more module here plus one entry in ``ROUTERS``;
the MoE layer, dispatch, experts and train step stay as they are.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.models import distill
from stablemoe_jax.models.routing import AUX_LOSS, METRICS, Routing, stablemoe_balance_loss


class StableMoERouter(nn.Module):
  """StableMoE's two-stage routing (Dai et al., 2022, Sections 3.1-3.3).

  Stage 1 (``in_stage1`` true): greedy top-1 on ``s = h E^T`` (float32), gate
  ``sigmoid(s[t, a_t])``, plus the balance loss and the distillation loss that
  teaches the word-embedding router the greedy assignment.
  Stage 2 and inference: the distilled router's argmax picks the expert; the
  gate still uses the original centroids ``E``, which keep learning through it.

  Attributes:
    num_experts: N.
    vocab_size: vocabulary size of the token ids fed to the distilled router.
    distill_dim: distilled routing feature dimension.
    balance_alpha: weight of the balance loss.
    distill_weight: weight of the distillation loss (1 in the paper, 0.3 in the authors' code).
    centroid_gain: orthogonal-init gain of the centroids.
  """

  num_experts: int
  vocab_size: int
  distill_dim: int = 50
  balance_alpha: float = 0.3
  distill_weight: float = 1.0
  centroid_gain: float = 0.1

  @nn.compact
  def __call__(self, h: jax.Array, token_ids: jax.Array, in_stage1: jax.Array) -> Routing:
    """h [T, d], token_ids int32 [T], in_stage1 bool scalar -> Routing over T tokens."""
    centroids = self.param(
        "centroids", nn.initializers.orthogonal(self.centroid_gain), (self.num_experts, h.shape[-1]),
        jnp.float32,
    )
    scores = h.astype(jnp.float32) @ centroids.T  # [T, N]
    greedy = jnp.argmax(scores, axis=-1)
    distilled_logits = distill.WordEmbeddingRouter(
        self.vocab_size, self.num_experts, self.distill_dim, self.centroid_gain,
        name=distill.DISTILLED_ROUTER_NAME,
    )(token_ids)
    distilled = jnp.argmax(distilled_logits, axis=-1)
    expert_index = jnp.where(in_stage1, greedy, distilled).astype(jnp.int32)
    gate = jax.nn.sigmoid(jnp.take_along_axis(scores, expert_index[:, None], axis=-1)[:, 0])

    stage1 = jnp.asarray(in_stage1, jnp.float32)
    target = jax.lax.stop_gradient(greedy)
    distill_loss = -jnp.mean(
        jnp.take_along_axis(jax.nn.log_softmax(distilled_logits), target[:, None], axis=-1)
    )
    self.sow(AUX_LOSS, "balance", stage1 * stablemoe_balance_loss(scores, greedy, self.balance_alpha))
    self.sow(AUX_LOSS, "distill", stage1 * self.distill_weight * distill_loss)
    self.sow(METRICS, "distill_loss", distill_loss)
    self.sow(METRICS, "distill_accuracy", jnp.mean((distilled == greedy).astype(jnp.float32)))
    # Routing analysis: share of tokens the frozen table sends elsewhere than the centroids' argmax (0 in stage 1).
    self.sow(METRICS, "centroid_disagreement", jnp.mean((expert_index != greedy).astype(jnp.float32)))
    return Routing(expert_index=expert_index, gate=gate)


def _stablemoe(settings, *, num_experts: int, vocab_size: int) -> nn.Module:
  return StableMoERouter(
      num_experts=num_experts, vocab_size=vocab_size, distill_dim=settings.distill_dim,
      balance_alpha=settings.balance_alpha, distill_weight=settings.distill_weight,
      centroid_gain=settings.centroid_gain, name="router",
  )


# name -> builder(settings, *, num_experts, vocab_size); settings is the config section ``model.moe.<name>``.
ROUTERS = {
    "stablemoe": _stablemoe,
}


def make_router(moe_config, *, vocab_size: int) -> nn.Module:
  """Builds the router named by ``moe_config.router`` from its own section ``moe_config[router]``."""
  name = moe_config.router
  if name not in ROUTERS:
    raise ValueError(f"unknown router {name!r}; choose one of {sorted(ROUTERS)}")
  return ROUTERS[name](moe_config[name], num_experts=moe_config.num_experts, vocab_size=vocab_size)

"""Distilled routers: cheap, token-id-only predictors of the learned routing.

StableMoE distils the stage-1 greedy assignment into a word-embedding router
(``D: vocab x dim`` and centroids ``Ê: N x dim``) that is frozen in stage 2
and used at inference. Its parameters live under a module named
``distilled_router`` so the optimizer can find and freeze them by path.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

DISTILLED_ROUTER_NAME = "distilled_router"


class WordEmbeddingRouter(nn.Module):
  """``ŝ[t, i] = Ê_i · D(x_t)``: routing logits from the token id alone.

  Attributes:
    vocab_size: number of token ids.
    num_experts: N.
    dim: routing feature dimension (50 in the paper).
    centroid_gain: gain of the orthogonal init of ``Ê`` (0.1 in the authors' code).
  """

  vocab_size: int
  num_experts: int
  dim: int = 50
  centroid_gain: float = 0.1

  @nn.compact
  def __call__(self, token_ids: jax.Array) -> jax.Array:
    """token_ids int32 [T] -> float32 logits [T, N]."""
    embedding = self.param("embedding", nn.initializers.normal(1.0), (self.vocab_size, self.dim))
    centroids = self.param(
        "centroids", nn.initializers.orthogonal(self.centroid_gain), (self.num_experts, self.dim)
    )
    features = jnp.take(embedding, token_ids, axis=0)
    return features @ centroids.T

"""Distilled routers: cheap, token-id-only predictors of the learned routing.

StableMoE distils the stage-1 greedy assignment into a word-embedding router
(``D: vocab x dim`` and centroids ``Ê: N x dim``) that is frozen in stage 2
and used at inference. Its parameters live under a module named
``distilled_router`` so the optimizer can find and freeze them by path.

The paper's Table 6 variants (``model.moe.distilled_router.kind``) replace the
embedding lookup by a causal CNN over the neighbouring tokens or by 1-3 causal
Transformer layers over the token ids. Causal: position t sees token ids <= t
only, since a language model's routing must not see the next token.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

DISTILLED_ROUTER_NAME = "distilled_router"


def _embedding_and_centroids(router: nn.Module) -> tuple[jax.Array, jax.Array]:
  """The parameters every distilled router has: ``embedding [V, dim]`` (N(0, 1)) and ``centroids [N, dim]``."""
  embedding = router.param("embedding", nn.initializers.normal(1.0), (router.vocab_size, router.dim))
  centroids = router.param("centroids", nn.initializers.orthogonal(router.centroid_gain),
                           (router.num_experts, router.dim))
  return embedding, centroids


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
    """token_ids int32 [T] (or any shape [...]) -> float32 logits [T, N] (T = all ids, flattened)."""
    embedding, centroids = _embedding_and_centroids(self)
    features = jnp.take(embedding, token_ids.reshape(-1), axis=0)
    return features @ centroids.T


class CausalCNNRouter(nn.Module):
  """Logits from the ids at positions t - kernel_size + 1 .. t: embedding -> causal conv -> ReLU -> centroids.

  Attributes: as WordEmbeddingRouter, plus kernel_size (window of token ids, the current one included).
  """

  vocab_size: int
  num_experts: int
  dim: int = 50
  kernel_size: int = 3
  centroid_gain: float = 0.1

  @nn.compact
  def __call__(self, token_ids: jax.Array) -> jax.Array:
    """token_ids int32 [B, S] -> float32 logits [B * S, N]."""
    _require_2d(token_ids)
    embedding, centroids = _embedding_and_centroids(self)
    x = jnp.take(embedding, token_ids, axis=0)  # [B, S, dim]
    x = nn.Conv(self.dim, (self.kernel_size,), padding=((self.kernel_size - 1, 0),), name="conv")(x)
    return nn.relu(x).reshape(-1, self.dim) @ centroids.T


class CausalTransformerRouter(nn.Module):
  """Logits from a small causal Transformer over the token ids (sinusoidal positions, pre-LN, ReLU FFN of 4 dim).

  Attributes: as WordEmbeddingRouter, plus num_layers and num_heads (must divide dim).
  """

  vocab_size: int
  num_experts: int
  dim: int = 50
  num_layers: int = 1
  num_heads: int = 2
  centroid_gain: float = 0.1

  @nn.compact
  def __call__(self, token_ids: jax.Array) -> jax.Array:
    """token_ids int32 [B, S] -> float32 logits [B * S, N]."""
    _require_2d(token_ids)
    embedding, centroids = _embedding_and_centroids(self)
    x = jnp.take(embedding, token_ids, axis=0) + _sinusoids(token_ids.shape[1], self.dim)
    mask = nn.make_causal_mask(token_ids)
    for i in range(self.num_layers):
      y = nn.SelfAttention(self.num_heads, name=f"attention_{i}")(nn.LayerNorm(name=f"ln_attention_{i}")(x), mask=mask)
      x = x + y
      y = nn.Dense(4 * self.dim, name=f"ffn_in_{i}")(nn.LayerNorm(name=f"ln_ffn_{i}")(x))
      x = x + nn.Dense(self.dim, name=f"ffn_out_{i}")(nn.relu(y))
    x = nn.LayerNorm(name="final_norm")(x)
    return x.reshape(-1, self.dim) @ centroids.T


def _sinusoids(length: int, dim: int) -> jax.Array:
  """Fixed sinusoidal position features [length, dim] (no parameter, any length)."""
  position = jnp.arange(length, dtype=jnp.float32)[:, None]
  rate = jnp.exp(-jnp.log(10000.0) * (jnp.arange(dim, dtype=jnp.float32) // 2 * 2) / dim)
  angle = position * rate[None]
  return jnp.where(jnp.arange(dim) % 2 == 0, jnp.sin(angle), jnp.cos(angle))


DISTILLED_KINDS = ("embedding", "cnn", "transformer")


def _require_2d(token_ids: jax.Array) -> None:
  if token_ids.ndim != 2:
    raise ValueError(f"this distilled router needs token ids [B, S] (got shape {token_ids.shape}): it is causal "
                     f"along S")


def make_distilled_router(spec, vocab_size: int, num_experts: int, name: str = DISTILLED_ROUTER_NAME) -> nn.Module:
  """The distilled router described by ``spec`` (kind, dim, kernel_size, num_layers, num_heads, centroid_gain)."""
  common = dict(vocab_size=vocab_size, num_experts=num_experts, dim=spec.dim, centroid_gain=spec.centroid_gain,
                name=name)
  if spec.kind == "embedding":
    return WordEmbeddingRouter(**common)
  if spec.kind == "cnn":
    return CausalCNNRouter(kernel_size=spec.kernel_size, **common)
  if spec.kind == "transformer":
    return CausalTransformerRouter(num_layers=spec.num_layers, num_heads=spec.num_heads, **common)
  raise ValueError(f"unknown distilled router kind {spec.kind!r}; choose one of {DISTILLED_KINDS}")

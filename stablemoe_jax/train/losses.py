"""Per-token losses of the tasks' steps (float32 whatever the compute dtype).

The models return :class:`~stablemoe_jax.models.head.HeadInputs` (the final hidden states and the tied
embedding); the tasks score them with :func:`head_mean_loss` (training) and :func:`head_token_nll` (evaluation).
Those apply the head in chunks of tokens without the whole logits when ``model.loss_chunk_tokens`` > 0
(``HeadInputs.chunk_tokens``, ``models/head.py``), else to the whole logits, through the logits' losses
:func:`token_nll`, :func:`label_smoothed_nll` and :func:`mean_loss`; the two agree to float32 rounding.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from stablemoe_jax.models.head import HeadInputs, chunked_mean_loss, chunked_nll


def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-token negative log-likelihood: logits [B, S, V], targets int32 [B, S] -> [B, S]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def label_smoothed_nll(logits: jax.Array, targets: jax.Array, smoothing: float) -> jax.Array:
  """Cross-entropy against ``(1 - smoothing) * one_hot + smoothing / V`` (fairseq's and flax wmt's form).

  logits [B, S, V], targets int32 [B, S] -> [B, S]. ``smoothing == 0`` is :func:`token_nll`.
  """
  if smoothing == 0.0:
    return token_nll(logits, targets)
  logits = logits.astype(jnp.float32)
  labels = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32), smoothing)
  return optax.softmax_cross_entropy(logits, labels)


def mean_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array, smoothing: float = 0.0) -> jax.Array:
  """float32 scalar: the weighted mean of :func:`label_smoothed_nll`, ``sum(loss * weights) / max(sum(weights), 1)``;
  logits [B, S, V], targets int32 and weights float32 [B, S]."""
  return jnp.sum(label_smoothed_nll(logits, targets, smoothing) * weights) / jnp.maximum(weights.sum(), 1.0)


def head_token_nll(head: HeadInputs, targets: jax.Array, smoothing: float = 0.0) -> jax.Array:
  """:func:`label_smoothed_nll` of the head's logits (hidden [B, S, d]), targets int32 [B, S] -> [B, S]: in chunks
  (:func:`~stablemoe_jax.models.head.chunked_nll`) when ``head.chunk_tokens`` > 0."""
  if head.chunk_tokens > 0:
    return chunked_nll(head, targets, smoothing)
  return label_smoothed_nll(head.logits(), targets, smoothing)


def head_mean_loss(head: HeadInputs, targets: jax.Array, weights: jax.Array, smoothing: float = 0.0) -> jax.Array:
  """:func:`mean_loss` of the head's logits (hidden [B, S, d]; targets, weights [B, S]) -> float32 scalar.

  ``head.chunk_tokens`` > 0: :func:`~stablemoe_jax.models.head.chunked_mean_loss` (its gradients computed chunk by
  chunk in the forward pass, no recompute in the backward).
  """
  if head.chunk_tokens > 0:
    return chunked_mean_loss(head, targets, weights, smoothing)
  return mean_loss(head.logits(), targets, weights, smoothing)

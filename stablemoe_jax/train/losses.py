"""Per-token losses of the tasks' steps (float32 whatever the compute dtype).

Each takes the model's float32 logits [B, S, V] or, with ``model.loss_chunk_tokens`` > 0, its
:class:`~stablemoe_jax.models.head.HeadInputs`, whose loss is computed in chunks of tokens without the whole
logits (``models/head.py``); the two agree to float32 rounding.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from stablemoe_jax.models.head import HeadInputs, chunked_mean_loss, chunked_nll


def token_nll(logits: jax.Array | HeadInputs, targets: jax.Array) -> jax.Array:
  """Per-token negative log-likelihood: logits [B, S, V] (or their HeadInputs), targets int32 [B, S] -> [B, S]."""
  if isinstance(logits, HeadInputs):
    return chunked_nll(logits, targets)
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def label_smoothed_nll(logits: jax.Array | HeadInputs, targets: jax.Array, smoothing: float) -> jax.Array:
  """Cross-entropy against ``(1 - smoothing) * one_hot + smoothing / V`` (fairseq's and flax wmt's form).

  logits [B, S, V] (or their HeadInputs), targets int32 [B, S] -> [B, S]. ``smoothing == 0`` is :func:`token_nll`.
  """
  if smoothing == 0.0:
    return token_nll(logits, targets)
  if isinstance(logits, HeadInputs):
    return chunked_nll(logits, targets, smoothing)
  logits = logits.astype(jnp.float32)
  labels = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32), smoothing)
  return optax.softmax_cross_entropy(logits, labels)


def mean_loss(logits: jax.Array | HeadInputs, targets: jax.Array, weights: jax.Array, smoothing: float = 0.0
              ) -> jax.Array:
  """float32 scalar: the weighted mean of :func:`label_smoothed_nll`, ``sum(loss * weights) / max(sum(weights), 1)``.

  From HeadInputs: :func:`~stablemoe_jax.models.head.chunked_mean_loss` (its gradients computed chunk by chunk in
  the forward pass, no recompute in the backward).
  """
  if isinstance(logits, HeadInputs):
    return chunked_mean_loss(logits, targets, weights, smoothing)
  return jnp.sum(label_smoothed_nll(logits, targets, smoothing) * weights) / jnp.maximum(weights.sum(), 1.0)

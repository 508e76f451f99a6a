"""Per-token losses of the tasks' steps (float32 whatever the compute dtype).

The models return :class:`~stablemoe_jax.models.head.HeadInputs` (the final hidden states and the tied
embedding); the tasks score them with :func:`head_mean_loss` (training) and :func:`head_token_nll` (evaluation).
Those apply the head in chunks of tokens without the whole logits when ``model.loss_chunk_tokens`` > 0
(``HeadInputs.chunk_tokens``: :func:`chunked_mean_loss`, :func:`chunked_nll`), else to the whole logits, through
the logits' losses :func:`token_nll`, :func:`label_smoothed_nll` and :func:`mean_loss`; the two agree to float32
rounding.

The chunked loss runs the head ``chunk`` tokens at a time, so no step writes the [T, V] float32 logits (6.6 GB a
pass at 32 x 1,024 tokens and V 50,257): training's :func:`chunked_mean_loss` computes each chunk's loss and its
gradients in the forward pass (a fused linear cross-entropy), evaluation's :func:`chunked_nll` the per-token loss
(under ``jax.checkpoint``, as MaxText's vocabulary tiling, if differentiated). Shape letters:
``models/__init__.py`` (here n chunks of P positions of each of the B rows).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from stablemoe_jax.models.head import HeadInputs


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
  (:func:`chunked_nll`) when ``head.chunk_tokens`` > 0."""
  if head.chunk_tokens > 0:
    return chunked_nll(head, targets, smoothing)
  return label_smoothed_nll(head.logits(), targets, smoothing)


def head_mean_loss(head: HeadInputs, targets: jax.Array, weights: jax.Array, smoothing: float = 0.0) -> jax.Array:
  """:func:`mean_loss` of the head's logits (hidden [B, S, d]; targets, weights [B, S]) -> float32 scalar.

  ``head.chunk_tokens`` > 0: :func:`chunked_mean_loss` (its gradients computed chunk by
  chunk in the forward pass, no recompute in the backward).
  """
  if head.chunk_tokens > 0:
    return chunked_mean_loss(head, targets, weights, smoothing)
  return mean_loss(head.logits(), targets, weights, smoothing)


def _in_chunks(head: HeadInputs, *per_token: jax.Array) -> tuple[int, jax.Array, tuple[jax.Array, ...]]:
  """(S, hidden [n, B, P, d], each of ``per_token`` [n, B, P]): hidden [B, S, d] (any leading shape: its last axis
  is S, the rest B) cut along S into n chunks of P positions of every row, B * P ~ ``chunk_tokens`` (P >= 1), the last
  padded with zeros (a padded token's hidden state, target and weight are 0). Every chunk keeps the rows' axis, so
  a batch split over devices stays split: each device computes its own rows of every chunk."""
  lead, d = head.hidden.shape[:-1], head.hidden.shape[-1]
  length = lead[-1] if lead else 1
  rows = head.hidden.size // d // length
  positions = max(1, min(length, head.chunk_tokens // rows))
  pad = -length % positions

  def split(a: jax.Array) -> jax.Array:  # [B, S, ...] -> [n, B, P, ...]
    a = jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
    return jnp.moveaxis(a.reshape(rows, -1, positions, *a.shape[2:]), 1, 0)
  return length, split(head.hidden.reshape(rows, length, d)), tuple(split(a.reshape(rows, length)) for a in per_token)


def _unsplit(chunks: jax.Array, length: int, shape: tuple[int, ...]) -> jax.Array:
  """[n, B, P, ...] chunks of :func:`_in_chunks` -> ``shape`` (the first ``length`` positions of every row)."""
  rows = chunks.shape[1]
  whole = jnp.moveaxis(chunks, 0, 1).reshape(rows, -1, *chunks.shape[3:])
  return whole[:, :length].reshape(shape)


def _chunk_loss(x_chunk: jax.Array, embedding: jax.Array, t_chunk: jax.Array, vocab: int, smoothing: float
                ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
  """One chunk of B * P tokens: x_chunk [B * P, d] and embedding [Vp, d] in the compute dtype, targets int32 [B * P]
  -> (per-token loss float32 [B * P], logits float32 [B * P, Vp] with the padded columns at -inf, their logsumexp
  [B * P], the real columns' mask)."""
  logits = jnp.dot(x_chunk, embedding.T).astype(jnp.float32)
  padded = embedding.shape[0]
  real = None
  if padded > vocab:
    real = jnp.arange(padded) < vocab
    logits = jnp.where(real, logits, -jnp.inf)
  lse = jax.nn.logsumexp(logits, axis=-1)
  target = jnp.take_along_axis(logits, t_chunk[:, None], axis=-1)[:, 0]
  nll = lse - target
  if smoothing:
    total = jnp.sum(logits if real is None else jnp.where(real, logits, 0.0), axis=-1)
    nll = lse - (1.0 - smoothing) * target - smoothing * total / vocab
  return nll, logits, lse, real


def chunked_nll(head: HeadInputs, targets: jax.Array, smoothing: float = 0.0) -> jax.Array:
  """Per-token cross-entropy, float32 [...] (targets int32 [...], the hidden states' leading shape).

  Against ``(1 - smoothing) * one_hot + smoothing / V`` over the V real ids (``smoothing`` 0: the plain NLL):
  ``lse - (1 - smoothing) z_target - smoothing * mean_v z_v``, which is ``optax.softmax_cross_entropy`` of the
  smoothed labels. The tokens are cut into chunks of about ``head.chunk_tokens`` (:func:`_in_chunks`: the same
  positions of every row); each chunk's logits [chunk, Vp] are computed in the compute dtype, cast to float32 and reduced inside ``jax.checkpoint``, so
  a backward keeps only the chunks' hidden states and recomputes each chunk's logits (one more head matmul;
  training uses :func:`chunked_mean_loss`, which does not). The embedding's gradient is summed over the chunks in
  float32 (the float32 embedding is what the scan closes over; each chunk casts it).
  """
  length, xs, (ts,) = _in_chunks(head, targets)
  embedding, vocab = head.embedding, head.vocab_size

  @jax.checkpoint
  def one_chunk(x_chunk: jax.Array, t_chunk: jax.Array) -> jax.Array:
    """x_chunk [B, P, d], t_chunk [B, P] -> [B, P]."""
    flat = x_chunk.reshape(-1, x_chunk.shape[-1])
    return _chunk_loss(flat, embedding.astype(flat.dtype), t_chunk.reshape(-1), vocab, smoothing)[0].reshape(
        t_chunk.shape)

  per_token = jax.lax.map(lambda pair: one_chunk(*pair), (xs, ts))
  return _unsplit(per_token, length, targets.shape)


def chunked_mean_loss(head: HeadInputs, targets: jax.Array, weights: jax.Array, smoothing: float = 0.0
                      ) -> jax.Array:
  """float32 scalar ``sum(weights * loss) / max(sum(weights), 1)`` of :func:`chunked_nll`'s per-token loss, whose
  gradients are computed in its forward pass, chunk by chunk (a fused linear cross-entropy, as Liger's and
  MaxText's): each chunk's logits [chunk, Vp] give its loss, ``dz = (softmax - smoothed labels) * weight / norm``,
  the hidden states' gradient ``dz @ E`` and the embedding's ``dz^T x`` (float32 accumulation over the chunks). The
  backward only scales those by the incoming cotangent: three head matmuls as with whole logits, no recompute, and
  no [T, V] array in either pass. targets int32, weights float32, both the hidden states' leading shape.
  """
  vocab, chunk = head.vocab_size, head.chunk_tokens

  @jax.custom_vjp
  def loss(hidden, embedding, targets, weights):
    return forward(hidden, embedding, targets, weights)[0]

  def forward(hidden, embedding, targets, weights):
    inputs = HeadInputs(hidden, embedding, vocab, chunk)
    length, xs, (ts, ws) = _in_chunks(inputs, targets, weights.astype(jnp.float32))
    norm = jnp.maximum(jnp.sum(weights.astype(jnp.float32)), 1.0)
    compute = embedding.astype(hidden.dtype)

    def one_chunk(carry, chunk_inputs):
      loss_sum, d_embedding = carry
      x_chunk, t_chunk, w_chunk = (a.reshape(-1, *a.shape[2:]) for a in chunk_inputs)  # [B * P, ...]
      nll, logits, lse, real = _chunk_loss(x_chunk, compute, t_chunk, vocab, smoothing)
      scale = w_chunk / norm  # [B * P]
      dz = jnp.exp(logits - lse[:, None]) * scale[:, None]  # softmax (0 at padded ids), minus the labels:
      if smoothing:
        dz = dz - (smoothing / vocab) * (scale[:, None] if real is None else jnp.where(real, scale[:, None], 0.0))
      dz = dz.at[jnp.arange(dz.shape[0]), t_chunk].add(-(1.0 - smoothing) * scale).astype(hidden.dtype)
      d_x = jnp.dot(dz, compute)
      d_embedding = d_embedding + jnp.dot(dz.T, x_chunk, preferred_element_type=jnp.float32)
      return (loss_sum + jnp.sum(nll * w_chunk), d_embedding), d_x.reshape(chunk_inputs[0].shape)

    start = (jnp.zeros((), jnp.float32), jnp.zeros(embedding.shape, jnp.float32))
    (loss_sum, d_embedding), d_xs = jax.lax.scan(one_chunk, start, (xs, ts, ws))
    d_hidden = _unsplit(d_xs, length, hidden.shape)
    return loss_sum / norm, (d_hidden, d_embedding.astype(embedding.dtype))

  def backward(residuals, g):
    d_hidden, d_embedding = residuals
    return (g * d_hidden).astype(d_hidden.dtype), g * d_embedding, None, None  # targets, weights: data

  loss.defvjp(forward, backward)
  return loss(head.hidden, head.embedding, targets, weights)

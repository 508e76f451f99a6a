"""The tied LM head and its cross-entropy: whole logits, or in chunks of tokens that never hold [T, V] float32.

``model.vocab_multiple`` pads the embedding's rows to a multiple (nanoGPT's 50,304 for GPT-2's 50,257): the
padded rows are never looked up and never scored (their logits are cut off or masked out of the softmax), so
the loss, the perplexity and every decoded id are those of the unpadded vocabulary.

The models (``TransformerLM``, ``TransformerSeq2Seq`` and its ``decode``) return :class:`HeadInputs`, what the
head needs (the final hidden states and the tied embedding), never logits: the task's loss
(``train/losses.head_mean_loss``, ``head_token_nll``) or a decoder (``HeadInputs.logits``) applies the head.
With ``model.loss_chunk_tokens`` > 0 the loss runs the head ``chunk`` tokens at a time, so no step writes the
[T, V] float32 logits (6.6 GB a pass at 32 x 1,024 tokens and V 50,257): training's :func:`chunked_mean_loss`
computes each chunk's loss and its gradients in the forward pass (a fused linear cross-entropy), evaluation's
:func:`chunked_nll` the per-token loss (under ``jax.checkpoint``, as MaxText's vocabulary tiling, if
differentiated).
Shape letters: ``models/__init__.py`` (here n chunks of P positions of each of the B rows).
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import linen as nn

from stablemoe_jax.core import settings as settings_lib


def padded_vocab_size(model_config) -> int:
  """``model.vocab_size`` rounded up to a multiple of ``model.vocab_multiple`` (0 or 1: not padded)."""
  model = settings_lib.typed(settings_lib.ModelSettings, model_config)
  multiple, vocab = model.vocab_multiple, model.vocab_size
  return -(-vocab // multiple) * multiple if multiple > 1 else vocab


def embedding_init(model_config) -> Any:
  """The token embedding's initializer, N(0, 1/d): [V, d] as unpadded, then zero rows up to the padded size.

  The first V rows are drawn exactly as an unpadded model's, so the same seed trains the same model either way.
  """
  normal = nn.initializers.normal(model_config.d_model**-0.5)
  vocab, padded = model_config.vocab_size, padded_vocab_size(model_config)
  if padded == vocab:
    return normal

  def init(key, shape, dtype=jnp.float32):
    return jnp.concatenate([normal(key, (vocab, shape[1]), dtype), jnp.zeros((padded - vocab, shape[1]), dtype)])
  return init


def tied_logits(x: jax.Array, embedding: jax.Array, vocab_size: int | None = None) -> jax.Array:
  """The tied LM head: x [..., d] in the compute dtype, embedding [Vp, d] (float32) -> logits float32 [..., V].

  The matmul runs in x's dtype and its result is cast to float32 for the softmax, as MaxText and PyTorch's
  autocast do: in bfloat16 that keeps the head (a quarter of a GPT-2-small step's FLOPs: 2 V d per token
  against ~7 d^2 per block) and both of its backward matmuls on the bf16 tensor cores, where float32
  inputs ran all three as float32 GEMMs. In float32 it is ``jnp.dot(x, embedding.T)``, as ``nn.Embed.attend``.
  A padded embedding (``vocab_size`` < Vp) computes Vp columns and returns the first ``vocab_size``.
  """
  logits = jnp.dot(x, embedding.astype(x.dtype).T).astype(jnp.float32)
  if vocab_size is not None and vocab_size < embedding.shape[0]:
    logits = logits[..., :vocab_size]
  return logits


@flax.struct.dataclass
class HeadInputs:
  """What the head needs: the models' output (the tasks' losses and the decoders apply the head to it).

  hidden: [..., d] the final LayerNorm's output in the compute dtype; embedding: float32 [Vp, d] (tied);
  vocab_size: the real vocabulary V <= Vp; chunk_tokens: ``model.loss_chunk_tokens``, the tokens per chunk of
  :func:`chunked_nll` / :func:`chunked_mean_loss` (0: the losses take the whole :meth:`logits`).
  """

  hidden: jax.Array
  embedding: jax.Array
  vocab_size: int = flax.struct.field(pytree_node=False)
  chunk_tokens: int = flax.struct.field(pytree_node=False)

  def logits(self) -> jax.Array:
    """The whole float32 logits [..., V] (:func:`tied_logits`)."""
    return tied_logits(self.hidden, self.embedding, self.vocab_size)


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

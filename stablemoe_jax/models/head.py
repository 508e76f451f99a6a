"""The tied LM head and its cross-entropy: whole logits, or in chunks of tokens that never hold [T, V] float32.

``model.vocab_multiple`` pads the embedding's rows to a multiple (nanoGPT's 50,304 for GPT-2's 50,257): the
padded rows are never looked up and never scored (their logits are cut off or masked out of the softmax), so
the loss, the perplexity and every decoded id are those of the unpadded vocabulary.

``model.loss_chunk_tokens`` > 0: the models return :class:`HeadInputs` (the final hidden states and the
embedding) instead of logits to the train and eval steps, and :func:`chunked_nll` computes the head and the
per-token loss ``chunk`` tokens at a time under ``jax.checkpoint``, as MaxText's vocabulary tiling does: the
forward keeps one chunk's [chunk, V] logits at a time and the backward recomputes them chunk by chunk, so
neither writes the [T, V] float32 logits (6.6 GB a pass at 32 x 1,024 tokens and V 50,257).
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import linen as nn


def padded_vocab_size(model_config) -> int:
  """``model.vocab_size`` rounded up to a multiple of ``model.vocab_multiple`` (0 or 1: not padded)."""
  multiple = model_config.get("vocab_multiple", 0)
  vocab = model_config.vocab_size
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
  """What the head needs, returned by the models in place of logits when ``model.loss_chunk_tokens`` > 0.

  hidden: [..., d] the final LayerNorm's output in the compute dtype; embedding: float32 [Vp, d] (tied);
  vocab_size: the real vocabulary V <= Vp; chunk_tokens: tokens per chunk of :func:`chunked_nll`.
  """

  hidden: jax.Array
  embedding: jax.Array
  vocab_size: int = flax.struct.field(pytree_node=False)
  chunk_tokens: int = flax.struct.field(pytree_node=False)

  def logits(self) -> jax.Array:
    """The whole float32 logits [..., V] (what the models return with chunking off)."""
    return tied_logits(self.hidden, self.embedding, self.vocab_size)


def chunked_nll(head: HeadInputs, targets: jax.Array, smoothing: float = 0.0) -> jax.Array:
  """Per-token cross-entropy, float32 [...] (targets int32 [...], the hidden states' leading shape).

  Against ``(1 - smoothing) * one_hot + smoothing / V`` over the V real ids (``smoothing`` 0: the plain NLL):
  ``lse - (1 - smoothing) z_target - smoothing * mean_v z_v``, which is ``optax.softmax_cross_entropy`` of the
  smoothed labels. The tokens are cut into chunks of ``head.chunk_tokens`` (the last zero-padded); each chunk's
  logits [chunk, Vp] are computed in the compute dtype, cast to float32 and reduced inside ``jax.checkpoint``,
  so only the chunk's hidden states are kept for the backward. The embedding's gradient is summed over the
  chunks in float32 (the float32 embedding is what the scan closes over; each chunk casts it).
  """
  d = head.hidden.shape[-1]
  x, t = head.hidden.reshape(-1, d), targets.reshape(-1)
  tokens = x.shape[0]
  chunk = max(1, min(head.chunk_tokens, tokens))
  pad = -tokens % chunk
  xs = jnp.pad(x, ((0, pad), (0, 0))).reshape(-1, chunk, d)
  ts = jnp.pad(t, (0, pad)).reshape(-1, chunk)
  vocab, padded = head.vocab_size, head.embedding.shape[0]
  embedding = head.embedding

  @jax.checkpoint
  def one_chunk(x_chunk: jax.Array, t_chunk: jax.Array) -> jax.Array:
    """x_chunk [C, d], t_chunk int32 [C] -> float32 [C]."""
    logits = jnp.dot(x_chunk, embedding.astype(x_chunk.dtype).T).astype(jnp.float32)  # [C, Vp]
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
    return nll

  per_token = jax.lax.map(lambda pair: one_chunk(*pair), (xs, ts))
  return per_token.reshape(-1)[:tokens].reshape(targets.shape)

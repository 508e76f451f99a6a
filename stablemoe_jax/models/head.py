"""The tied LM head: the logits of the final hidden states against the tied embedding, in the compute dtype.

``model.vocab_multiple`` pads the embedding's rows to a multiple (nanoGPT's 50,304 for GPT-2's 50,257): the
padded rows are never looked up and never scored (their logits are cut off or masked out of the softmax), so
the loss, the perplexity and every decoded id are those of the unpadded vocabulary.

The models (``TransformerLM``, ``TransformerSeq2Seq`` and its ``decode``) return :class:`HeadInputs`, what the
head needs (the final hidden states and the tied embedding), never logits: the task's loss
(``train/losses.head_mean_loss``, ``head_token_nll``; with ``model.loss_chunk_tokens`` > 0 in chunks of tokens that
never hold the [T, V] float32 logits, ``train/losses.chunked_mean_loss`` and ``chunked_nll``) or a decoder
(``HeadInputs.logits``) applies the head. Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import linen as nn

from stablemoe_jax.core.settings import ModelSettings


def padded_vocab_size(model: ModelSettings) -> int:
  """``model.vocab_size`` rounded up to a multiple of ``model.vocab_multiple`` (0 or 1: not padded)."""
  multiple, vocab = model.vocab_multiple, model.vocab_size
  return -(-vocab // multiple) * multiple if multiple > 1 else vocab


def embedding_init(model: ModelSettings) -> Any:
  """The token embedding's initializer, N(0, 1/d): [V, d] as unpadded, then zero rows up to the padded size.

  The first V rows are drawn exactly as an unpadded model's, so the same seed trains the same model either way.
  """
  normal = nn.initializers.normal(model.d_model**-0.5)
  vocab, padded = model.vocab_size, padded_vocab_size(model)
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

"""Encoder-decoder Transformer for translation (pre-LayerNorm, learned positions) with MoE layers.

One joint vocabulary: the source and target share the token embedding, which is also the output layer
(tied). MoE layers go where ``model.moe.placement`` puts them in a stack of ``model.num_layers`` blocks
(``moe_positions``; "middle" of 6 blocks: after the third, as the paper), once in the encoder and once in
the decoder, as the same ``MoELayer`` (routers, distilled routers, dispatchers) as the language model. The
encoder's routers read the source ids, the decoder's the decoder's input ids (the shifted target).

Decoding (``decode=True``) feeds one position at a time: the decoder self-attention keeps its keys and
values in the ``cache`` collection; the encoder output and each decoder block's cross-attention keys and
values (``cross_keys_values``) are computed once per sentence and passed in, so a step projects only its
own token.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.core.constants import PAD_ID  # noqa: F401  (the pad id; re-exported)
from stablemoe_jax.core.settings import ModelSettings
from stablemoe_jax.models.experts import FFNExperts, apply_ffn_experts
from stablemoe_jax.models.moe import make_moe_layer
from stablemoe_jax.models.head import HeadInputs, embedding_init, padded_vocab_size
from stablemoe_jax.models.transformer import dense_match_plan, moe_positions

CACHE = "cache"  # the Flax collection of the decoder self-attention's keys and values


def _heads_first(x: jax.Array) -> jax.Array:
  """[B, S, H, Dh] -> [B, H, S, Dh]: the attention's batch dimensions (B, H) leading, as its matmuls want them."""
  return x.transpose(0, 2, 1, 3)


class MultiHeadAttention(nn.Module):
  """Multi-head attention of queries [B, Sq, d] over keys/values [B, Sk, d] with a boolean mask.

  The keys and values may also come projected already (``project_keys_values``), as the decoder's
  cross-attention does when decoding. With ``decode=True`` (self-attention only) the keys and values of each
  call are appended to a cache of ``max_len`` positions created by an ``init`` with ``decode=True`` on inputs
  [B, max_len]; the queries then attend to every cached position so far. Keys, values and the cache are
  kept heads-first, [B, H, S, Dh], so that a decode step reads them without transposing them.
  """

  num_heads: int
  d_model: int
  dtype: Any = jnp.float32

  def setup(self):
    head_dim = self.d_model // self.num_heads
    dense = lambda: nn.DenseGeneral((self.num_heads, head_dim), dtype=self.dtype)
    self.query, self.key, self.value = dense(), dense(), dense()
    self.out = nn.DenseGeneral(self.d_model, axis=(-2, -1), dtype=self.dtype)

  def project_keys_values(self, keys_values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """keys_values [B, Sk, d] -> their keys and values, each [B, H, Sk, Dh]."""
    return _heads_first(self.key(keys_values)), _heads_first(self.value(keys_values))

  @nn.compact  # the decode cache's variables are created here
  def __call__(self, queries: jax.Array, keys_values: jax.Array | tuple[jax.Array, jax.Array],
               mask: jax.Array | None, decode: bool = False) -> jax.Array:
    """queries [B, Sq, d]; keys_values [B, Sk, d], or ``project_keys_values`` of them (k, v), each [B, H, Sk, Dh];
    mask bool [B, 1 or H, Sq, Sk] (True: attend) -> [B, Sq, d]."""
    q = _heads_first(self.query(queries))  # [B, H, Sq, Dh]
    k, v = keys_values if isinstance(keys_values, (list, tuple)) else self.project_keys_values(keys_values)
    if decode:
      k, v, mask = self._extend_cache(k, v)
    head_dim = q.shape[-1]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(head_dim).astype(jnp.float32)
    if mask is not None:
      scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    return self.out(jnp.einsum("bhqk,bhkd->bqhd", weights, v))

  def _extend_cache(self, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Writes k, v [B, H, Sq, Dh] at the cache index; returns all cached k, v [B, H, L, Dh] and their mask."""
    initialised = self.has_variable(CACHE, "cached_key")
    cached_key = self.variable(CACHE, "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_value = self.variable(CACHE, "cached_value", jnp.zeros, v.shape, v.dtype)
    index = self.variable(CACHE, "index", lambda: jnp.array(0, jnp.int32))
    if not initialised:  # the init call only creates the cache [B, H, max_len, Dh]
      return k, v, nn.make_causal_mask(k[:, 0, :, 0])
    start = index.value
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k.astype(cached_key.value.dtype),
                                                    (0, 0, start, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v.astype(cached_value.value.dtype),
                                                      (0, 0, start, 0))
    index.value = start + k.shape[2]
    length = cached_key.value.shape[2]
    query_positions = start + jnp.arange(k.shape[2])
    mask = jnp.arange(length)[None, :] <= query_positions[:, None]  # [Sq, L]: causal over the cache
    return cached_key.value, cached_value.value, mask[None, None]


class FeedForward(nn.Module):
  """ReLU FFN: x [B, S, d] -> [B, S, d]."""

  d_ff: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    y = nn.Dense(self.d_ff, dtype=self.dtype, name="ffn_in")(x)
    return nn.Dense(x.shape[-1], dtype=self.dtype, name="ffn_out")(nn.relu(y))


class EncoderBlock(nn.Module):
  """Pre-LN: x + SelfAttn(LN(x)) over non-padding keys, then x + FFN(LN(x)); x [B, S, d] -> [B, S, d]."""

  num_heads: int
  d_ff: int
  dropout: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
    """mask bool [B, 1, 1 or S, S]."""
    drop = nn.Dropout(self.dropout)
    y = nn.LayerNorm(dtype=self.dtype)(x)
    attention = MultiHeadAttention(self.num_heads, x.shape[-1], self.dtype, name="self_attention")
    x = x + drop(attention(y, y, mask), deterministic=deterministic)
    y = FeedForward(self.d_ff, self.dtype, name="ffn")(nn.LayerNorm(dtype=self.dtype)(x))
    return x + drop(y, deterministic=deterministic)


class DecoderBlock(nn.Module):
  """Pre-LN: causal self-attention, attention over the encoder output, FFN; each a residual sublayer."""

  num_heads: int
  d_model: int
  d_ff: int
  dropout: float
  dtype: Any = jnp.float32

  def setup(self):
    # The attentions are built here so that ``cross_keys_values`` reaches the cross-attention; the FFN and the
    # LayerNorms stay in ``__call__`` (LayerNorm_0..2): the parameter tree is the same as when all were there.
    self.self_attention = MultiHeadAttention(self.num_heads, self.d_model, self.dtype)
    self.cross_attention = MultiHeadAttention(self.num_heads, self.d_model, self.dtype)

  def cross_keys_values(self, encoded: jax.Array) -> tuple[jax.Array, jax.Array]:
    """encoded [B, Ss, d] -> the cross-attention's keys and values, each [B, H, Ss, Dh]."""
    return self.cross_attention.project_keys_values(encoded)

  @nn.compact
  def __call__(self, x: jax.Array, encoded: jax.Array | tuple[jax.Array, jax.Array], cross_mask: jax.Array,
               deterministic: bool, decode: bool = False, self_mask: jax.Array | None = None) -> jax.Array:
    """x [B, S, d]; encoded [B, Ss, d], or its ``cross_keys_values``; cross_mask bool [B, 1, 1 or S, Ss]; self_mask
    bool [B, 1, S, S] (None: causal) -> [B, S, d]."""
    drop = nn.Dropout(self.dropout)
    y = nn.LayerNorm(dtype=self.dtype)(x)
    if self_mask is None and not decode:
      self_mask = nn.make_causal_mask(x[..., 0])
    x = x + drop(self.self_attention(y, y, self_mask, decode), deterministic=deterministic)
    y = nn.LayerNorm(dtype=self.dtype)(x)
    x = x + drop(self.cross_attention(y, encoded, cross_mask), deterministic=deterministic)
    y = FeedForward(self.d_ff, self.dtype, name="ffn")(nn.LayerNorm(dtype=self.dtype)(x))
    return x + drop(y, deterministic=deterministic)


def padding_mask(source: jax.Array) -> jax.Array:
  """source int32 [B, Ss] -> bool [B, 1, 1, Ss]: True at real (non-pad) source positions."""
  return (source != PAD_ID)[:, None, None, :]


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
  """Packed rows: query_segments int32 [B, Sq], key_segments [B, Sk] (pair number, 0 = padding) -> bool
  [B, 1, Sq, Sk], True where the key is a real position of the query's own pair."""
  same = query_segments[:, :, None] == key_segments[:, None, :]
  return (same & (key_segments > 0)[:, None, :])[:, None]


class TransformerSeq2Seq(nn.Module):
  """Encoder-decoder Transformer over a joint vocabulary with tied embeddings and MoE layers.

  Attributes:
    config: the ``model`` settings, typed where the run starts (vocab_size, d_model, num_heads, num_layers (each of encoder and decoder),
      d_ff, max_len, dropout, dtype, ``moe`` and ``dense_match``, as the language model's).

  Parameters are float32; ``model.dtype`` is the compute dtype; logits are float32. ``__call__`` and ``decode``
  return the head's inputs (:class:`HeadInputs`), not logits: the task's loss or the decoder applies the head
  (``.logits()``, or the chunked loss, ``models/head.py``). The MoE layers are the
  top-level modules ``encoder_moe_{k}`` and ``decoder_moe_{k}`` (the dense baselines: ``*_dense_ffn_{k}``).
  """

  config: ModelSettings

  def setup(self):
    cfg = self.config
    d = cfg.d_model
    dtype = jnp.dtype(cfg.dtype)
    self.embed = nn.Embed(padded_vocab_size(cfg), d, embedding_init=embedding_init(cfg))
    self.positions = self.param("positions", nn.initializers.normal(d**-0.5), (cfg.max_len, d))
    self.embedding_dropout = nn.Dropout(cfg.dropout)
    self.encoder_blocks = [EncoderBlock(cfg.num_heads, cfg.d_ff, cfg.dropout, dtype)
                           for _ in range(cfg.num_layers)]
    self.decoder_blocks = [DecoderBlock(cfg.num_heads, d, cfg.d_ff, cfg.dropout, dtype)
                           for _ in range(cfg.num_layers)]
    self.encoder_norm = nn.LayerNorm(dtype=dtype)
    self.decoder_norm = nn.LayerNorm(dtype=dtype)
    moe = cfg.moe
    self.dense_match = cfg.dense_match
    placement = moe_positions(cfg.num_layers, moe.placement) if moe.enabled or self.dense_match != "none" else ()
    self.placement = placement
    if self.dense_match != "none":  # one dense "expert" per MoE position with the MoE layer's parameters
      sublayers, width = dense_match_plan(cfg)
      self.encoder_dense_ffn = [FFNExperts(1, sublayers, width) for _ in placement]
      self.decoder_dense_ffn = [FFNExperts(1, sublayers, width) for _ in placement]
    elif placement:
      sublayers = max(1, moe.sublayers_per_expert // len(placement))
      layer = lambda: make_moe_layer(moe, cfg.vocab_size, sublayers, moe.d_ff or cfg.d_ff, cfg.dropout, dtype)
      self.encoder_moe = [layer() for _ in placement]
      self.decoder_moe = [layer() for _ in placement]

  def _embed(self, tokens: jax.Array, start: jax.Array | int, deterministic: bool,
             positions: jax.Array | None = None) -> jax.Array:
    """tokens [B, S] at positions start .. start + S - 1 (or at ``positions`` int32 [B, S]) -> [B, S, d] (scaled
    embedding + position)."""
    d = self.config.d_model
    if positions is None:
      positions = jax.lax.dynamic_slice_in_dim(self.positions, start, tokens.shape[1])
    else:
      positions = self.positions[positions]
    x = self.embed(tokens) * jnp.sqrt(d) + positions
    x = self.embedding_dropout(x, deterministic=deterministic)
    return x.astype(jnp.dtype(self.config.dtype))

  def _moe_position(self, side: str, k: int, x: jax.Array, token_ids: jax.Array, in_stage1: jax.Array,
                    deterministic: bool) -> jax.Array:
    """The k-th MoE layer (or its dense stand-in) of ``side`` ("encoder" | "decoder")."""
    if self.dense_match != "none":
      ffn_params = getattr(self, f"{side}_dense_ffn")[k](x.shape[-1])
      rng = self.make_rng("dropout") if self.config.dropout > 0 and not deterministic else None
      rows = jnp.arange(x.shape[0], dtype=jnp.int32)  # each sequence its own dropout "group"
      return x + apply_ffn_experts(ffn_params, x[None], jnp.zeros((1,), jnp.int32), rows, rng,
                                   dropout=self.config.dropout, dtype=jnp.dtype(self.config.dtype))[0]
    # Padding takes no expert capacity and counts in no routing loss or metric.
    return getattr(self, f"{side}_moe")[k](x, token_ids, in_stage1, deterministic, token_mask=token_ids != PAD_ID)

  def _stack(self, side: str, num_blocks: int, x, token_ids, in_stage1, deterministic, run_block):
    """``run_block(i, x)`` for each block i with the MoE layers at their positions (``moe_positions``: blocks
    before each)."""
    for block in range(num_blocks + 1):
      for k in [k for k, p in enumerate(self.placement) if p == block]:
        x = self._moe_position(side, k, x, token_ids, in_stage1, deterministic)
      if block < num_blocks:
        x = run_block(block, x)
    return x

  def encode(self, source: jax.Array, in_stage1: jax.Array, deterministic: bool = True,
             segments: jax.Array | None = None, positions: jax.Array | None = None) -> jax.Array:
    """source int32 [B, Ss] (pad = PAD_ID) -> encoded [B, Ss, d].

    Packed rows (``data/translation/batches.pack_rows``): ``segments`` int32 [B, Ss] numbers each position's pair
    (0: padding) and ``positions`` int32 [B, Ss] its place in that pair; a position then attends to its own pair.
    """
    x = self._embed(source, 0, deterministic, positions)
    # Keys only: a pad position's own output is never read.
    mask = padding_mask(source) if segments is None else segment_mask(segments, segments)
    x = self._stack("encoder", len(self.encoder_blocks), x, source, in_stage1, deterministic,
                    lambda i, x: self.encoder_blocks[i](x, mask, deterministic))
    return self.encoder_norm(x)

  def cross_keys_values(self, encoded: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
    """encoded [B, Ss, d] -> each decoder block's cross-attention keys and values, each [B, H, Ss, Dh].

    What ``decode`` would project from ``encoded`` at every call; decoding computes it once and passes it instead.
    """
    return [block.cross_keys_values(encoded) for block in self.decoder_blocks]

  def decode(self, encoded: jax.Array | list[tuple[jax.Array, jax.Array]], source: jax.Array,
             decoder_inputs: jax.Array, in_stage1: jax.Array, deterministic: bool = True, decode: bool = False,
             position: jax.Array | int = 0, source_segments: jax.Array | None = None,
             target_segments: jax.Array | None = None, target_positions: jax.Array | None = None) -> HeadInputs:
    """The :class:`HeadInputs` (hidden [B, St, d], the tied embedding) of the next token's logits at each decoder
    input position (``.logits()``: float32 [B, St, V]).

    Args:
      encoded: [B, Ss, d], the encoder output, or its ``cross_keys_values`` (the same logits, without
        projecting the encoder output again).
      source: int32 [B, Ss], the source ids (for the cross-attention padding mask).
      decoder_inputs: int32 [B, St], bos followed by the target (teacher forcing), or St = 1 when decoding.
      in_stage1: bool scalar.
      deterministic: no dropout.
      decode: cached decoding: ``decoder_inputs`` continue the cached positions (call with
        ``mutable=["cache"]``).
      position: the position of ``decoder_inputs[:, 0]`` (the step index when decoding).
      source_segments, target_segments, target_positions: int32 [B, Ss] / [B, St] / [B, St] of packed rows (see
        ``encode``): a target position attends to its own pair's earlier targets and its own source; None:
        one pair a row.
    """
    memory = encoded if isinstance(encoded, (list, tuple)) else [encoded] * len(self.decoder_blocks)
    if target_segments is None:
      cross_mask, self_mask = padding_mask(source), None
    else:
      cross_mask = segment_mask(target_segments, source_segments)
      self_mask = segment_mask(target_segments, target_segments) & nn.make_causal_mask(decoder_inputs, dtype=jnp.bool_)
    y = self._embed(decoder_inputs, position, deterministic, target_positions)
    y = self._stack("decoder", len(self.decoder_blocks), y, decoder_inputs, in_stage1, deterministic,
                    lambda i, y: self.decoder_blocks[i](y, memory[i], cross_mask, deterministic, decode, self_mask))
    y = self.decoder_norm(y)
    return HeadInputs(y, self.embed.embedding, self.config.vocab_size, self.config.loss_chunk_tokens)

  def __call__(self, source: jax.Array, decoder_inputs: jax.Array, in_stage1: jax.Array,
               deterministic: bool = True, decode: bool = False,
               source_segments: jax.Array | None = None, source_positions: jax.Array | None = None,
               target_segments: jax.Array | None = None, target_positions: jax.Array | None = None
               ) -> HeadInputs:
    """source int32 [B, Ss], decoder_inputs int32 [B, St], in_stage1 bool scalar -> the :class:`HeadInputs` of
    the logits [B, St, V] (``decode``). The segments and positions [B, Ss] / [B, St] come with packed rows
    (``encode``, ``decode``)."""
    encoded = self.encode(source, in_stage1, deterministic, source_segments, source_positions)
    return self.decode(encoded, source, decoder_inputs, in_stage1, deterministic, decode,
                       source_segments=source_segments, target_segments=target_segments,
                       target_positions=target_positions)


def empty_decode_cache(model: TransformerSeq2Seq, source: jax.Array, length: int, stage2: jax.Array) -> dict:
  """The decoder self-attention's cache before the first decode step, for the rows of ``source`` [B, Ss] and
  ``length`` (<= max_len) decoded positions: every block's keys and values [B, H, length, Dh] and its index, all
  zeros, as ``init`` with ``decode=True`` makes them. Only their shapes are traced (``eval_shape``): no parameter is
  initialised and nothing is compiled."""
  decoder_inputs = jnp.zeros((source.shape[0], length), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), source, decoder_inputs, stage2, decode=True)[CACHE])
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

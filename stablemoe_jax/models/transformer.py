"""Decoder-only Transformer LM (pre-LayerNorm, learned positions, tied embeddings) with MoE layers.

Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.core.settings import ModelSettings
from stablemoe_jax.models.experts import FFNExperts, apply_ffn_experts
from stablemoe_jax.models.head import HeadInputs, embedding_init, padded_vocab_size
from stablemoe_jax.models import routers
from stablemoe_jax.models.moe import MoELayer, make_moe_layer

PLACEMENTS = ("bottom", "middle", "top", "scattered")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")
# model.remat -> the jax.checkpoint policy of the rematerialised decoder blocks and MoE layers.
REMAT_POLICIES = {
    "none": None,  # no remat: every activation the backward pass needs is stored
    "block": jax.checkpoint_policies.nothing_saveable,  # store block inputs only, recompute the rest
    # store the outputs of weight matmuls (no batch dims), recompute the rest (attention scores, expert
    # einsums, elementwise): most of the saving, little of the recompute
    "block_dots_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def moe_positions(num_layers: int, placement: str) -> tuple[int, ...]:
  """Where MoE layers go, as the number of blocks before each one.

  bottom: before the first block; middle: after block L/2; top: after the last
  block; scattered: after blocks L/4, 2L/4 and 3L/4 (the paper's Table 4).
  """
  table = {
      "bottom": (0,),
      "middle": (num_layers // 2,),
      "top": (num_layers,),
      "scattered": (num_layers // 4, num_layers // 2, 3 * num_layers // 4),
  }
  if placement not in table:
    raise ValueError(f"unknown MoE placement {placement!r}; choose one of {PLACEMENTS}")
  return table[placement]


def has_moe_layers(model: ModelSettings) -> bool:
  """Whether the model routes tokens at all (a dense baseline with ``dense_match`` has none)."""
  return model.has_moe_layers


def count_params(model: ModelSettings, seq_len: int = 8) -> int:
  """Parameters of the TransformerLM that ``model`` describes (abstract init: nothing is allocated)."""
  tokens = jnp.zeros((1, min(seq_len, model.max_len)), jnp.int32)
  shapes = jax.eval_shape(lambda: TransformerLM(model).init(jax.random.key(0), tokens, jnp.array(True)))
  return sum(int(x.size) for x in jax.tree.leaves(shapes["params"]))


def _ffn_sublayer_params(d: int, width: int) -> int:
  return width * (2 * d + 1) + 3 * d  # LayerNorm (2d), in (d x w + w), out (w x d + d)


@functools.lru_cache(maxsize=32)
def _dense_plan(model: ModelSettings) -> tuple[int, int]:
  how = model.dense_match
  with_moe = dataclasses.replace(model, dense_match="none", moe=dataclasses.replace(model.moe, enabled=True))
  moe_total = count_params(with_moe)
  without = dataclasses.replace(with_moe, moe=dataclasses.replace(model.moe, enabled=False))
  positions = len(moe_positions(model.num_layers, model.moe.placement))
  extra = (moe_total - count_params(without)) / positions
  d, width = model.d_model, model.moe.d_ff or model.d_ff
  if how == "flops":  # a token's k routed experts' FFNs and every shared one: one FFN (k + n) times as wide
    experts_per_token = routers.top_k(model.moe) + model.moe.shared_experts
    return max(1, model.moe.sublayers_per_expert // positions), width * experts_per_token
  if how == "wider":
    sublayers = max(1, model.moe.sublayers_per_expert // positions)
  else:
    sublayers = max(1, round(extra / _ffn_sublayer_params(d, width)))
  return sublayers, max(1, round((extra / sublayers - 3 * d) / (2 * d + 1)))


def dense_match_plan(model: ModelSettings) -> tuple[int, int]:
  """(FFN sublayers, width) at each MoE position of the dense model matching the MoE model.

  ``model.dense_match``: "deeper" keeps the expert width and adds sublayers (as many as the experts' parameters
  allow), "wider" keeps ``sublayers_per_expert`` and widens them; either way the width is then fitted so the
  total parameters match to within one sublayer's rounding (a few hundred parameters). "flops" matches the
  compute a token instead: at each MoE position one expert's sublayers at (k + n) times its width, what a top-k
  MoE layer with n shared experts (``model.moe.shared_experts``) applies to each token (its router aside): one
  expert's FFN for top-1 routing.
  """
  return _dense_plan(model)


def attention_implementation(model: ModelSettings, backend: str | None = None) -> str:
  """``model.attention`` resolved for ``backend`` (default: JAX's): "xla" or "cudnn".

  "auto" is cuDNN's fused (flash) attention on a GPU when the compute dtype is bfloat16 / float16 and
  the head dimension is a multiple of 8 of at most 128 (what cuDNN's kernel takes), XLA's elsewhere.
  "cudnn" where it cannot run raises ValueError here, at trace time, before anything is compiled.
  """
  name = model.attention
  backend = backend or jax.default_backend()
  dtype = jnp.dtype(model.dtype)
  head_dim = model.d_model // model.num_heads
  if name == "auto":
    fits = backend == "gpu" and dtype in _CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if fits else "xla"
  if name == "cudnn":
    if backend != "gpu":
      raise ValueError(f"model.attention='cudnn' needs an NVIDIA GPU, but JAX's backend is {backend!r}; "
                       f"use --config.model.attention=auto (xla here) or xla.")
    if dtype not in _CUDNN_DTYPES:
      raise ValueError(f"model.attention='cudnn' needs model.dtype bfloat16 or float16 (got "
                       f"{model.dtype!r}); use --config.model.attention=auto or --config.model.dtype=bfloat16.")
  elif name not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f"model.attention={name!r} is unknown; choose one of {ATTENTION_IMPLEMENTATIONS}.")
  return name


class CausalSelfAttention(nn.Module):
  """Multi-head causal self-attention: x [B, S, d] -> [B, S, d].

  ``implementation``: "xla" (scores [B, H, S, S] computed in full and masked) or "cudnn" (fused, skips
  the masked half); see :func:`attention_implementation`.
  """

  num_heads: int
  dtype: Any = jnp.float32
  implementation: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d = x.shape[-1]
    head_dim = d // self.num_heads
    qkv = nn.DenseGeneral((3, self.num_heads, head_dim), dtype=self.dtype, name="qkv")(x)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, S, H, Dh] each
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=self.implementation)
    return nn.DenseGeneral(d, axis=(-2, -1), dtype=self.dtype, name="out")(out)


class DecoderBlock(nn.Module):
  """Pre-LN block: x + Attn(LN(x)), then x + FFN(LN(x)); x [B, S, d] -> [B, S, d]."""

  num_heads: int
  d_ff: int
  dropout: float
  dtype: Any = jnp.float32
  attention: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    drop = nn.Dropout(self.dropout)
    attention = CausalSelfAttention(self.num_heads, self.dtype, self.attention, name="attention")
    y = attention(nn.LayerNorm(dtype=self.dtype)(x))
    x = x + drop(y, deterministic=deterministic)
    y = nn.Dense(self.d_ff, dtype=self.dtype, name="ffn_in")(nn.LayerNorm(dtype=self.dtype)(x))
    y = nn.Dense(x.shape[-1], dtype=self.dtype, name="ffn_out")(nn.relu(y))
    return x + drop(y, deterministic=deterministic)


class TransformerLM(nn.Module):
  """Decoder-only LM with MoE layers inserted between blocks.

  Attributes:
    config: the ``model`` settings (vocab_size, d_model, num_heads, num_layers, d_ff, max_len, dropout, dtype,
      attention, remat, ``moe`` and ``dense_match``), typed where the run starts (the task's ``build_model``).

  ``model.dtype`` is the compute dtype: parameters stay float32 (the optimizer's master weights) and are
  cast where used; router affinities and every loss are float32; the LM head's matmul runs in the compute
  dtype and its logits are cast to float32 (:func:`models.head.tied_logits`). The model returns the head's inputs
  (:class:`HeadInputs`), not logits: the task's loss applies the head (whole or in chunks, ``models/head.py``).
  """

  config: ModelSettings

  @nn.compact
  def __call__(self, tokens: jax.Array, in_stage1: jax.Array, deterministic: bool = True) -> HeadInputs:
    """tokens int32 [B, S], in_stage1 bool scalar -> the :class:`HeadInputs` of the next-token logits: hidden
    [B, S, d] and the tied embedding [Vp, d] (``.logits()``: float32 [B, S, V])."""
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    d = cfg.d_model
    embed = nn.Embed(padded_vocab_size(cfg), d, embedding_init=embedding_init(cfg), name="embed")
    positions = self.param("positions", nn.initializers.normal(d**-0.5), (cfg.max_len, d))
    x = embed(tokens) * jnp.sqrt(d) + positions[: tokens.shape[1]]
    x = nn.Dropout(cfg.dropout)(x, deterministic=deterministic).astype(dtype)

    attention = attention_implementation(cfg)
    remat = cfg.remat
    if remat not in REMAT_POLICIES:
      raise ValueError(f"model.remat={remat!r} is unknown; choose one of {tuple(REMAT_POLICIES)}.")
    block_cls, moe_cls = DecoderBlock, MoELayer
    if remat != "none":  # static_argnums count self: DecoderBlock(x, deterministic), MoELayer(x, ids, stage1, det)
      block_cls = nn.remat(DecoderBlock, static_argnums=(2,), policy=REMAT_POLICIES[remat])
      moe_cls = nn.remat(MoELayer, static_argnums=(4,), policy=REMAT_POLICIES[remat])

    moe = cfg.moe
    dense_match = cfg.dense_match
    placement = moe_positions(cfg.num_layers, moe.placement) if moe.enabled or dense_match != "none" else ()
    sublayers = moe.sublayers_per_expert // len(placement) if placement else 0
    for block in range(cfg.num_layers + 1):
      for k in [k for k, p in enumerate(placement) if p == block]:
        if dense_match != "none":  # one dense "expert" with the MoE model's parameters, every token through it
          dense_sublayers, width = dense_match_plan(cfg)
          ffn_params = FFNExperts(1, dense_sublayers, width, name=f"dense_ffn_{k}")(d)
          rng = self.make_rng("dropout") if cfg.dropout > 0 and not deterministic else None
          rows = jnp.arange(x.shape[0], dtype=jnp.int32)  # each sequence its own dropout "group"
          x = x + apply_ffn_experts(ffn_params, x[None], jnp.zeros((1,), jnp.int32), rows, rng,
                                    dropout=cfg.dropout, dtype=dtype)[0]
          continue
        x = make_moe_layer(moe, cfg.vocab_size, max(1, sublayers), moe.d_ff or cfg.d_ff, cfg.dropout, dtype,
                           layer_cls=moe_cls, name=f"moe_{k}")(x, tokens, in_stage1, deterministic)
      if block < cfg.num_layers:
        x = block_cls(cfg.num_heads, cfg.d_ff, cfg.dropout, dtype, attention, name=f"block_{block}")(
            x, deterministic)
    x = nn.LayerNorm(dtype=dtype, name="final_norm")(x)
    return HeadInputs(x, embed.embedding, cfg.vocab_size, cfg.loss_chunk_tokens)

"""A plain JAX/Flax GPT-2 train step: the speed reference for the project's dense backbone.

Nothing from ``stablemoe_jax`` is used, on purpose: this is what a JAX engineer writes from scratch for
the same shapes, so ``benchmarks.throughput``'s ``dense / reference`` ratio measures the project's overhead,
not the model. It matches the project's dense model where that decides the cost:

* pre-LN blocks of causal self-attention (``jax.nn.dot_product_attention``, the same implementation as the
  project's ``model.attention`` resolves to) and a ReLU FFN, learned positions, a final LayerNorm and a
  tied LM head; ``d_model``, heads, blocks, ``d_ff``, vocabulary and sequence length from the config;
* float32 parameters (the optimizer's master weights), the config's compute dtype (``model.dtype``);
  the LM head's matmul runs in that dtype, and its logits are cast to float32 for the cross-entropy;
* Adam (the config's betas, eps, peak lr as a constant) after global-norm clipping, the step jitted with the
  state donated.

No dropout (the paper-scale presets set ``model.dropout = 0``), no routing, no microbatches, no mesh.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct


@dataclasses.dataclass(frozen=True)
class GPT2Shape:
  """The reference model's sizes and compute dtype."""

  vocab_size: int
  d_model: int
  num_heads: int
  num_layers: int
  d_ff: int
  max_len: int
  dtype: Any = jnp.bfloat16
  attention: str = "xla"  # jax.nn.dot_product_attention implementation: xla | cudnn


class Block(nn.Module):
  """x [B, S, d] -> x + Attn(LN(x)) -> + FFN(LN(x))."""

  shape: GPT2Shape

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    s = self.shape
    b, length, d = x.shape
    head_dim = d // s.num_heads
    h = nn.LayerNorm(dtype=s.dtype)(x)
    qkv = nn.Dense(3 * d, dtype=s.dtype)(h).reshape(b, length, 3, s.num_heads, head_dim)
    attended = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True,
                                            implementation=s.attention)
    x = x + nn.Dense(d, dtype=s.dtype)(attended.reshape(b, length, d))
    h = nn.Dense(s.d_ff, dtype=s.dtype)(nn.LayerNorm(dtype=s.dtype)(x))
    return x + nn.Dense(d, dtype=s.dtype)(nn.relu(h))


class GPT2(nn.Module):
  """tokens int32 [B, S] -> logits float32 [B, S, V]."""

  shape: GPT2Shape

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    s = self.shape
    wte = self.param("wte", nn.initializers.normal(0.02), (s.vocab_size, s.d_model))
    wpe = self.param("wpe", nn.initializers.normal(0.01), (s.max_len, s.d_model))
    x = (wte[tokens] + wpe[: tokens.shape[1]]).astype(s.dtype)
    for _ in range(s.num_layers):
      x = Block(s)(x)
    x = nn.LayerNorm(dtype=s.dtype)(x)
    return (x @ wte.astype(s.dtype).T).astype(jnp.float32)


class ReferenceState(struct.PyTreeNode):
  """step int32 [], params, opt_state: what the jitted step carries (and donates)."""

  step: jax.Array
  params: Any
  opt_state: optax.OptState


def shape_from_config(config) -> GPT2Shape:
  """The reference shapes of a project config (``config.model`` / ``config.train``)."""
  model = config.model
  implementation = {"auto": "cudnn" if jax.default_backend() == "gpu" and model.dtype != "float32" else "xla"}
  attention = implementation.get(model.attention, model.attention)
  return GPT2Shape(model.vocab_size, model.d_model, model.num_heads, model.num_layers, model.d_ff,
                   config.train.seq_len, jnp.dtype(model.dtype), attention)


def make_optimizer(train_config) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(train_config.clip_norm),
                     optax.adam(train_config.learning_rate, b1=train_config.adam_b1, b2=train_config.adam_b2,
                                eps=train_config.adam_eps))


def init_state(model: GPT2, tx: optax.GradientTransformation, seed: int) -> ReferenceState:
  def init():
    params = model.init(jax.random.key(seed), jnp.zeros((1, model.shape.max_len), jnp.int32))["params"]
    return ReferenceState(jnp.array(0, jnp.int32), params, tx.init(params))
  return jax.jit(init)()


def make_train_step(model: GPT2, tx: optax.GradientTransformation):
  """``(state, batch) -> (state, {"loss", "task_loss"})``; batch: inputs / targets int32 [B, S]."""
  def loss_fn(params, batch):
    logits = model.apply({"params": params}, batch["inputs"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

  def train_step(state: ReferenceState, batch):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return ReferenceState(state.step + 1, params, opt_state), {"loss": loss, "task_loss": loss}

  return train_step


def jit_train_step(model: GPT2, tx: optax.GradientTransformation):
  return jax.jit(make_train_step(model, tx), donate_argnums=0)


def train_flops_per_token(shape: GPT2Shape, seq_len: int) -> int:
  """Analytic train FLOPs per token, 3 x forward (matmuls at 2 per multiply-add; attention over all S keys).

  Forward: per block 2 (4 d^2 + 2 d d_ff) for the qkv, output and FFN kernels plus 4 S d for ``QK^T`` and
  ``AV``; the tied LM head 2 V d. Written out here rather than read from a parameter tree, so that it
  checks ``stablemoe_jax.models.flops`` on the same shapes (tests/benchmarks/test_throughput.py).
  """
  d = shape.d_model
  per_block = 2 * (4 * d * d + 2 * d * shape.d_ff) + 4 * seq_len * d
  return 3 * (shape.num_layers * per_block + 2 * shape.vocab_size * d)

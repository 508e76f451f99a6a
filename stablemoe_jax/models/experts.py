"""Experts as stacked parameters, run as batched matmuls over the expert axis."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
  """LayerNorm over the last axis of x [..., d] with float32 statistics."""
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mean).mean(-1, keepdims=True)
  return ((x32 - mean) * jax.lax.rsqrt(var + eps) * scale + bias).astype(x.dtype)


class FFNExperts(nn.Module):
  """E experts, each a stack of ``num_sublayers`` pre-LayerNorm residual ReLU FFN sublayers.

  Returns what the stack adds to its input, ``stack(x) - x``, so the MoE layer
  computes ``h + gate * Expert(h)``: the same as fairseq's
  ``gate * stack(h) + (1 - gate) * h``. The output projections start at zero
  (as in the authors' code), so every expert starts as the identity.

  Attributes:
    num_experts: E.
    num_sublayers: FFN sublayers per expert.
    d_ff: hidden width of each FFN.
    dropout: dropout rate on each sublayer's output.
    dtype: computation dtype.
  """

  num_experts: int
  num_sublayers: int
  d_ff: int
  dropout: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    """x [E, C, d] -> [E, C, d]."""
    e, s, d, f = self.num_experts, self.num_sublayers, x.shape[-1], self.d_ff
    w_in_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2, out_axis=-1)
    ln_scale = self.param("ln_scale", nn.initializers.ones, (e, s, d))
    ln_bias = self.param("ln_bias", nn.initializers.zeros, (e, s, d))
    w_in = self.param("w_in", w_in_init, (e, s, d, f))
    b_in = self.param("b_in", nn.initializers.zeros, (e, s, f))
    w_out = self.param("w_out", nn.initializers.zeros, (e, s, f, d))
    b_out = self.param("b_out", nn.initializers.zeros, (e, s, d))
    y = x
    for i in range(s):
      z = layer_norm(y, ln_scale[:, None, i], ln_bias[:, None, i])
      z = jnp.einsum("ecd,edf->ecf", z, w_in[:, i].astype(self.dtype)) + b_in[:, None, i].astype(self.dtype)
      z = jnp.einsum("ecf,efd->ecd", nn.relu(z), w_out[:, i].astype(self.dtype))
      z = z + b_out[:, None, i].astype(self.dtype)
      y = y + nn.Dropout(self.dropout)(z, deterministic=deterministic)
    return y - x

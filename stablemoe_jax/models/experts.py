"""Experts as stacked parameters ``[N, ...]``, run as batched matmuls over the expert axis.

The parameters are created at their global shape by :class:`FFNExperts` (annotated with the
logical ``experts`` axis, so they can be split over devices), and applied by the pure function
:func:`apply_ffn_experts`, which a dispatcher may call inside ``jax.shard_map`` on the local experts.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.parallel.sharding import EXPERTS


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
  """LayerNorm over the last axis of x [..., d] with float32 statistics."""
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mean).mean(-1, keepdims=True)
  return ((x32 - mean) * jax.lax.rsqrt(var + eps) * scale + bias).astype(x.dtype)


class FFNExperts(nn.Module):
  """Parameters of N experts, each a stack of ``num_sublayers`` pre-LN residual ReLU FFN sublayers.

  The output projections start at zero (as in the authors' code), so every expert starts as the
  identity. Calling the module returns the parameter dict (leaves ``[N, s, ...]``).

  Attributes:
    num_experts: N.
    num_sublayers: FFN sublayers per expert (s).
    d_ff: hidden width of each FFN.
    bias_init: "zeros" (both biases 0: each expert adds exactly 0 at first) or "torch" (the authors' code:
      PyTorch's default ``nn.Linear`` bias, ``b_in ~ U(+-1/sqrt(d))`` and ``b_out ~ U(+-1/sqrt(d_ff))``; only
      the output weight is zeroed, so each expert starts by adding the constant ``b_out`` of its last sublayers).
    partitioned: whether the leading axis is the logical ``experts`` axis (split over the mesh's expert devices);
      False for experts every token goes through (``model.moe.shared_experts``), which are replicated.
  """

  num_experts: int
  num_sublayers: int
  d_ff: int
  bias_init: str = "zeros"
  partitioned: bool = True

  @nn.compact
  def __call__(self, d_model: int) -> dict[str, jax.Array]:
    e, s, d, f = self.num_experts, self.num_sublayers, d_model, self.d_ff

    def param(name, init, shape):
      axes = (EXPERTS if self.partitioned else None,) + (None,) * (len(shape) - 1)
      return self.param(name, nn.with_logical_partitioning(init, axes), shape)

    w_in_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2, out_axis=-1)
    if self.bias_init not in EXPERT_BIAS_INITS:
      raise ValueError(f"expert bias_init={self.bias_init!r} is unknown; choose one of {EXPERT_BIAS_INITS}.")
    torch_bias = self.bias_init == "torch"
    b_in_init = torch_linear_bias_init(d) if torch_bias else nn.initializers.zeros
    b_out_init = torch_linear_bias_init(f) if torch_bias else nn.initializers.zeros
    return {
        "ln_scale": param("ln_scale", nn.initializers.ones, (e, s, d)),
        "ln_bias": param("ln_bias", nn.initializers.zeros, (e, s, d)),
        "w_in": param("w_in", w_in_init, (e, s, d, f)),
        "b_in": param("b_in", b_in_init, (e, s, f)),
        "w_out": param("w_out", nn.initializers.zeros, (e, s, f, d)),
        "b_out": param("b_out", b_out_init, (e, s, d)),
    }


# model.moe.expert_bias_init: "zeros" (this project's default) | "torch" (the authors' code, PyTorch's nn.Linear).
EXPERT_BIAS_INITS = ("zeros", "torch")


def torch_linear_bias_init(fan_in: int):
  """PyTorch's default ``nn.Linear`` bias init: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
  bound = 1.0 / fan_in ** 0.5

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def dropout_keep_mask(rng: jax.Array, expert_ids: jax.Array, group_ids: jax.Array, sublayer: int,
                      shape: tuple[int, int], rate: float) -> jax.Array:
  """bool [N', G', C, d]: the keep mask of (expert, group, sublayer), whatever device computes it.

  Each (global expert, global group) pair draws from ``fold_in(fold_in(fold_in(rng, e), g), sublayer)``,
  so the masks do not depend on the device layout.
  """
  def one(e, g):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(rng, e), g), sublayer)
    return jax.random.bernoulli(key, 1.0 - rate, shape)
  return jax.vmap(lambda e: jax.vmap(lambda g: one(e, g))(group_ids))(expert_ids)


def apply_ffn_experts(params: dict[str, jax.Array], x: jax.Array, expert_ids: jax.Array, group_ids: jax.Array,
                      rng: jax.Array | None, *, dropout: float = 0.0, dtype: Any = jnp.float32) -> jax.Array:
  """What each expert's stack adds to its input: x [N', G', C, d] -> ``stack(x) - x`` [N', G', C, d].

  Args:
    params: the experts' parameters, leaves ``[N', s, ...]`` (all experts, or this device's).
    x: rows per (expert, group, slot).
    expert_ids: int32 [N'], global ids of the experts in ``params`` (for dropout keys).
    group_ids: int32 [G'], global ids of the routing groups along x's second axis (for dropout keys).
    rng: dropout key, or None for no dropout.
    dropout: dropout rate on each sublayer's output.
    dtype: computation dtype.
  """
  y = x
  for i in range(params["w_in"].shape[1]):
    z = layer_norm(y, params["ln_scale"][:, None, None, i], params["ln_bias"][:, None, None, i])
    z = jnp.einsum("egcd,edf->egcf", z, params["w_in"][:, i].astype(dtype))
    z = z + params["b_in"][:, None, None, i].astype(dtype)
    z = jnp.einsum("egcf,efd->egcd", nn.relu(z), params["w_out"][:, i].astype(dtype))
    z = z + params["b_out"][:, None, None, i].astype(dtype)
    if rng is not None and dropout > 0:
      keep = dropout_keep_mask(rng, expert_ids, group_ids, i, x.shape[2:], dropout)
      z = jnp.where(keep, z / (1.0 - dropout), jnp.zeros_like(z))
    y = y + z
  return y - x

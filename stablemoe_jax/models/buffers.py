"""Moving token rows: into a group's per-expert capacity buffers ``[N, C, d]`` by slot, and back in token order.

What every dispatcher (``dispatch.py``, ``grouped_dispatch.py``) moves its tokens with. The slots come from
``capacity.py`` (``N * C``: a dropped token, which goes nowhere and gets zeros back). Gathers back to token order
have a gather as their backward (:func:`gather_rows`), not XLA's scatter-add. Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def scatter_to_buffers(x: jax.Array, slots: jax.Array, num_experts: int, capacity: int) -> jax.Array:
  """x [Tg, d], slots int32 [Tg] -> [N, C, d]; empty slots are zero, dropped tokens go nowhere."""
  buffer = jnp.zeros((num_experts * capacity + 1, x.shape[-1]), x.dtype)
  buffer = buffer.at[slots].set(x, unique_indices=False)
  return buffer[:-1].reshape(num_experts, capacity, x.shape[-1])


@jax.custom_vjp
def gather_rows(y: jax.Array, index: jax.Array) -> jax.Array:
  """y [R, d] (any R rows), index int32 [n] -> [n, d]: row ``index[i]`` of y, zeros where ``index[i] == R``.

  The indices other than R must be distinct (a slot or row holds at most one token). The backward is
  then a gather as well, not XLA's scatter-add: each row of y takes the cotangent of the one token that
  read it (zero if none did).
  """
  return _gather_rows(y, index)


def _gather_rows(y, index):
  return jnp.concatenate([y, jnp.zeros((1, y.shape[-1]), y.dtype)])[index]


def inverse_index(index: jax.Array, num_rows: int) -> jax.Array:
  """int32 [n] (values in [0, R]) -> [R]: the i with ``index[i] == r``, or n where none; R is ignored."""
  tokens = index.shape[0]
  return jnp.full((num_rows,), tokens, jnp.int32).at[index].set(jnp.arange(tokens, dtype=jnp.int32), mode="drop")


def _gather_rows_fwd(y, index):
  return _gather_rows(y, index), (index, y.shape[0])


def _gather_rows_bwd(res, ct):
  index, num_rows = res
  return _gather_rows(ct, inverse_index(index, num_rows)), None


gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


def gather_from_buffers(y: jax.Array, slots: jax.Array) -> jax.Array:
  """y [N, C, d], slots int32 [Tg] -> [Tg, d] in token order; dropped tokens get zeros."""
  return gather_rows(y.reshape(-1, y.shape[-1]), slots)

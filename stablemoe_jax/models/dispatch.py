"""Token dispatch by index into per-expert capacity buffers, and back.

Tokens are placed by scatter into ``[E, C, d]`` buffers (first come, first
served within each expert) and brought back by gather; nothing of shape
``[T, E, C]`` is built. Tokens past an expert's capacity are dropped: the
combine step returns zeros for them, so the layer passes them through.

This is the piece expert parallelism replaces: an all-to-all dispatcher only
has to offer the same ``dispatch`` / ``combine`` pair.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct


def expert_capacity(num_tokens: int, num_experts: int, capacity_factor: float) -> int:
  """``ceil(capacity_factor * T / N)``, at most T; ``capacity_factor <= 0`` means no limit (T)."""
  if capacity_factor <= 0:
    return num_tokens
  return max(1, min(num_tokens, math.ceil(capacity_factor * num_tokens / num_experts)))


class IndexDispatcher(struct.PyTreeNode):
  """Slot of every token in the flattened ``[E * C]`` buffer.

  Attributes:
    slot: int32 [T]; ``expert * C + position`` for kept tokens, ``E * C`` for dropped ones.
    num_experts: E (static).
    capacity: C (static).
  """

  slot: jax.Array
  num_experts: int = struct.field(pytree_node=False)
  capacity: int = struct.field(pytree_node=False)

  @classmethod
  def create(cls, expert_index: jax.Array, num_experts: int, capacity: int) -> "IndexDispatcher":
    """expert_index int32 [T] -> dispatcher for buffers of C = ``capacity`` slots per expert."""
    assigned = jax.nn.one_hot(expert_index, num_experts, dtype=jnp.int32)  # [T, E]
    position = jnp.sum(jnp.cumsum(assigned, axis=0) * assigned, axis=-1) - 1  # [T]
    kept = position < capacity
    slot = jnp.where(kept, expert_index * capacity + position, num_experts * capacity)
    return cls(slot=slot.astype(jnp.int32), num_experts=num_experts, capacity=capacity)

  @property
  def kept(self) -> jax.Array:
    """bool [T]: the token fits in its expert's capacity."""
    return self.slot < self.num_experts * self.capacity

  def dispatch(self, x: jax.Array) -> jax.Array:
    """x [T, d] -> [E, C, d]; empty slots are zero."""
    buffer = jnp.zeros((self.num_experts * self.capacity + 1, x.shape[-1]), x.dtype)
    buffer = buffer.at[self.slot].set(x, unique_indices=False)
    return buffer[:-1].reshape(self.num_experts, self.capacity, x.shape[-1])

  def combine(self, y: jax.Array) -> jax.Array:
    """y [E, C, d] -> [T, d] in token order; dropped tokens get zeros."""
    flat = jnp.concatenate([y.reshape(-1, y.shape[-1]), jnp.zeros((1, y.shape[-1]), y.dtype)])
    return flat[self.slot]

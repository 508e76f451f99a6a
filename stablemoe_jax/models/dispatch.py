"""Token dispatch into per-expert capacity buffers ``[E, G, C, d]`` and back, in routing groups.

Tokens are routed in G groups of ``T / G`` consecutive tokens; each (group, expert) pair has
C slots, filled first come, first served in the group's order (optionally a seeded permutation of
it, so an overflowing expert drops random tokens). Tokens past C are dropped: they get zeros back
and the MoE layer passes them through. A run depends on G, never on how many devices share it.

A dispatcher is one function with the signature of :data:`Dispatcher`:
``(x [G, Tg, d], slots [G, Tg], expert_params, rng, *, expert_fn, num_experts, capacity) -> [G, Tg, d]``.
It places the tokens into buffers, calls ``expert_fn(params, buffers [E_local, G', C, d],
expert_ids [E_local], group_ids [G'], rng)`` and brings the rows back in token order:

- ``index``: scatter / gather by slot on one device (or under GSPMD);
- ``all_to_all``: the same per device under ``jax.shard_map``, with one tiled all-to-all over the
  mesh's ``expert`` axis each way, so each device runs only its own experts;
- ``one_hot``: GShard's dense ``[T, E, C]`` mask einsum, kept for the benchmark only.
Nothing of shape ``[T, E, C]`` is built by the first two.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from stablemoe_jax.parallel import sharding as sharding_lib

ExpertFn = Callable[..., jax.Array]


class Dispatcher(Protocol):
  def __call__(self, x: jax.Array, slots: jax.Array, expert_params: Any, rng: jax.Array | None, *,
               expert_fn: ExpertFn, num_experts: int, capacity: int) -> jax.Array: ...


def expert_capacity(num_tokens: int, num_experts: int, capacity_factor: float) -> int:
  """``ceil(capacity_factor * T / N)``, at most T; ``capacity_factor <= 0`` means no limit (T).

  With routing groups, ``num_tokens`` is the group size ``T / G``.
  """
  if capacity_factor <= 0:
    return num_tokens
  return max(1, min(num_tokens, math.ceil(capacity_factor * num_tokens / num_experts)))


def _positions(expert_index: jax.Array, num_experts: int) -> jax.Array:
  """int32 [Tg] -> [Tg]: how many earlier tokens of the group chose the same expert."""
  assigned = jax.nn.one_hot(expert_index, num_experts, dtype=jnp.int32)  # [Tg, E]
  return jnp.sum(jnp.cumsum(assigned, axis=0) * assigned, axis=-1) - 1


def group_slots(expert_index: jax.Array, num_experts: int, capacity: int,
                shuffle_rng: jax.Array | None = None) -> jax.Array:
  """Slot of every token in its group's flattened ``[E * C]`` buffer.

  Args:
    expert_index: int32 [G, Tg], the expert of each token, groups along the first axis.
    num_experts: E.
    capacity: C, slots per (group, expert).
    shuffle_rng: if given, positions are assigned in a random order within each group (one
      permutation per group from ``fold_in(shuffle_rng, group)``), so overflow drops random tokens.

  Returns:
    int32 [G, Tg]: ``expert * C + position`` for kept tokens, ``E * C`` for dropped ones.
  """
  groups, group_size = expert_index.shape
  if shuffle_rng is None:
    position = jax.vmap(_positions, in_axes=(0, None))(expert_index, num_experts)
  else:
    keys = jax.vmap(lambda g: jax.random.fold_in(shuffle_rng, g))(jnp.arange(groups))
    order = jax.vmap(lambda k: jax.random.permutation(k, group_size))(keys)  # [G, Tg]
    shuffled = jax.vmap(_positions, in_axes=(0, None))(jnp.take_along_axis(expert_index, order, axis=1), num_experts)
    position = jax.vmap(lambda o, p: jnp.zeros_like(p).at[o].set(p))(order, shuffled)
  slot = jnp.where(position < capacity, expert_index * capacity + position, num_experts * capacity)
  return slot.astype(jnp.int32)


def scatter_to_buffers(x: jax.Array, slots: jax.Array, num_experts: int, capacity: int) -> jax.Array:
  """x [Tg, d], slots int32 [Tg] -> [E, C, d]; empty slots are zero, dropped tokens go nowhere."""
  buffer = jnp.zeros((num_experts * capacity + 1, x.shape[-1]), x.dtype)
  buffer = buffer.at[slots].set(x, unique_indices=False)
  return buffer[:-1].reshape(num_experts, capacity, x.shape[-1])


def gather_from_buffers(y: jax.Array, slots: jax.Array) -> jax.Array:
  """y [E, C, d], slots int32 [Tg] -> [Tg, d] in token order; dropped tokens get zeros."""
  flat = jnp.concatenate([y.reshape(-1, y.shape[-1]), jnp.zeros((1, y.shape[-1]), y.dtype)])
  return flat[slots]


def index_dispatch(x, slots, expert_params, rng, *, expert_fn, num_experts, capacity):
  """Scatter / gather by slot, all experts on this device (or partitioned by GSPMD)."""
  groups = x.shape[0]
  buffers = jax.vmap(scatter_to_buffers, in_axes=(0, 0, None, None))(x, slots, num_experts, capacity)
  y = expert_fn(expert_params, buffers.swapaxes(0, 1), jnp.arange(num_experts), jnp.arange(groups), rng)
  return jax.vmap(gather_from_buffers)(y.swapaxes(0, 1), slots)


def one_hot_dispatch(x, slots, expert_params, rng, *, expert_fn, num_experts, capacity):
  """GShard-style dispatch through a dense ``[G, Tg, E, C]`` mask (for the benchmark only)."""
  groups, group_size = slots.shape
  mask = jax.nn.one_hot(slots, num_experts * capacity + 1, dtype=x.dtype)[..., :-1]
  mask = mask.reshape(groups, group_size, num_experts, capacity)
  buffers = jnp.einsum("gtec,gtd->egcd", mask, x)
  y = expert_fn(expert_params, buffers, jnp.arange(num_experts), jnp.arange(groups), rng)
  return jnp.einsum("gtec,egcd->gtd", mask, y)


def all_to_all_dispatch(x, slots, expert_params, rng, *, expert_fn, num_experts, capacity):
  """Expert parallelism under ``jax.shard_map`` on the mesh of the current ``jax.set_mesh`` context.

  Per device: its G / n_tokens groups -> ``[E, G_local, C, d]`` -> tiled all-to-all over ``expert``
  -> ``[E / n_expert, n_expert * G_local, C, d]`` (every row its local experts get) -> the local
  experts as one batched matmul -> all-to-all back -> gather in token order.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if sharding_lib.EXPERT_AXIS not in mesh.axis_names:
    raise ValueError("the all_to_all dispatcher needs a mesh with an 'expert' axis: call the model under "
                     "jax.set_mesh(stablemoe_jax.parallel.mesh.make_mesh(...)).")
  n_expert = mesh.shape[sharding_lib.EXPERT_AXIS]
  local_experts = num_experts // n_expert
  token_axes = sharding_lib.token_axes(mesh)
  data_axes = tuple(a for a in token_axes if a != sharding_lib.EXPERT_AXIS)

  def local(x, slots, params, rng):
    groups_local = x.shape[0]
    buffers = jax.vmap(scatter_to_buffers, in_axes=(0, 0, None, None))(x, slots, num_experts, capacity)
    buffers = jax.lax.all_to_all(buffers.swapaxes(0, 1), sharding_lib.EXPERT_AXIS, 0, 1, tiled=True)
    expert_ids = jax.lax.axis_index(sharding_lib.EXPERT_AXIS) * local_experts + jnp.arange(local_experts)
    # Rows arrive ordered (source device along `expert`, its local group); name their global groups.
    data_index = jax.lax.axis_index(data_axes) if data_axes else 0
    sources = data_index * n_expert + jnp.arange(n_expert)
    group_ids = (sources[:, None] * groups_local + jnp.arange(groups_local)).reshape(-1)
    y = expert_fn(params, buffers, expert_ids, group_ids, rng)
    y = jax.lax.all_to_all(y, sharding_lib.EXPERT_AXIS, 1, 0, tiled=True)  # [E, G_local, C, d]
    return jax.vmap(gather_from_buffers)(y.swapaxes(0, 1), slots)

  params_spec = jax.tree.map(lambda _: P(sharding_lib.EXPERT_AXIS), expert_params)
  return jax.shard_map(local, in_specs=(P(token_axes), P(token_axes), params_spec, P()),
                       out_specs=P(token_axes), check_vma=True)(x, slots, expert_params, rng)


DISPATCHERS: dict[str, Dispatcher] = {
    "index": index_dispatch,
    "all_to_all": all_to_all_dispatch,
    "one_hot": one_hot_dispatch,
}
DISPATCHER_NAMES = ("auto", *DISPATCHERS)


def choose_dispatcher(name: str) -> Dispatcher:
  """``model.moe.dispatcher`` -> a dispatcher; "auto": all_to_all when the mesh's ``expert`` axis is > 1."""
  if name == "auto":
    mesh = jax.sharding.get_abstract_mesh()
    name = "all_to_all" if mesh.shape.get(sharding_lib.EXPERT_AXIS, 1) > 1 else "index"
  if name not in DISPATCHERS:
    raise ValueError(f"unknown dispatcher {name!r}; choose one of {DISPATCHER_NAMES}")
  return DISPATCHERS[name]

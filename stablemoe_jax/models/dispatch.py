"""Token dispatch into per-expert capacity buffers ``[E, G, C, d]`` and back, in routing groups.

Tokens are routed in G groups of ``T / G`` consecutive tokens; each (group, expert) pair has
C slots, filled first come, first served in the group's order (optionally a seeded permutation of
it, so an overflowing expert drops random tokens). With top-k routing every choice takes a slot: all first
choices in that order, then all second choices (:func:`choice_slots`), and the dispatchers see each choice as a
row of its own. Tokens past C are dropped: they get zeros back
and the MoE layer passes them through. A run depends on G, never on how many devices share it.

A dispatcher is one function with the signature of :data:`Dispatcher`:
``(x [G, Tg, d], slots [G, Tg], expert_params, rng, *, expert_fn, num_experts, capacity) -> [G, Tg, d]``.
It places the tokens into buffers, calls ``expert_fn(params, buffers [E_local, G', C, d],
expert_ids [E_local], group_ids [G'], rng)`` and brings the rows back in token order:

- ``index``: scatter / gather by slot on one device (or under GSPMD);
- ``all_to_all``: the same per device under ``jax.shard_map``, with one tiled all-to-all over the
  mesh's ``expert`` axis each way, so each device runs only its own experts;
- ``grouped``: the same slots as ``index``, but the kept tokens of all groups on expert-sorted rows
  padded per expert to a block of b rows, each block through its own expert: about the routed rows'
  FLOPs instead of ``E * C`` rows per group (the CPU's evaluation default when nothing is dropped; on a
  GPU its block loop is far slower than ``index``);
- ``one_hot``: GShard's dense ``[T, E, C]`` mask einsum, kept for the benchmark only.
Nothing of shape ``[T, E, C]`` is built by the others. Gathers back to token order have a gather as
their backward (:func:`gather_rows`), not a scatter-add.
"""
from __future__ import annotations

import functools
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
                shuffle_rng: jax.Array | None = None, valid: jax.Array | None = None) -> jax.Array:
  """Slot of every token in its group's flattened ``[E * C]`` buffer.

  Args:
    expert_index: int32 [G, Tg], the expert of each token, groups along the first axis.
    num_experts: E.
    capacity: C, slots per (group, expert).
    shuffle_rng: if given, positions are assigned in a random order within each group (one
      permutation per group from ``fold_in(shuffle_rng, group)``), so overflow drops random tokens.
    valid: bool [G, Tg] or None: tokens with False (padding) take no slot and displace no real token.

  Returns:
    int32 [G, Tg]: ``expert * C + position`` for kept tokens, ``E * C`` for dropped (or invalid) ones.
  """
  groups, group_size = expert_index.shape
  if valid is not None:  # padding queues at an extra expert E, whose slots are then discarded
    slots = group_slots(jnp.where(valid, expert_index, num_experts), num_experts + 1, capacity, shuffle_rng)
    return jnp.where(valid & (slots < num_experts * capacity), slots, num_experts * capacity).astype(jnp.int32)
  if shuffle_rng is None:
    position = jax.vmap(_positions, in_axes=(0, None))(expert_index, num_experts)
  else:
    keys = jax.vmap(lambda g: jax.random.fold_in(shuffle_rng, g))(jnp.arange(groups))
    order = jax.vmap(lambda k: jax.random.permutation(k, group_size))(keys)  # [G, Tg]
    shuffled = jax.vmap(_positions, in_axes=(0, None))(jnp.take_along_axis(expert_index, order, axis=1), num_experts)
    position = jax.vmap(lambda o, p: jnp.zeros_like(p).at[o].set(p))(order, shuffled)
  slot = jnp.where(position < capacity, expert_index * capacity + position, num_experts * capacity)
  return slot.astype(jnp.int32)


def choice_slots(expert_index: jax.Array, num_experts: int, capacity: int,
                 shuffle_rng: jax.Array | None = None, valid: jax.Array | None = None) -> jax.Array:
  """Slots of every token's k choices (top-k routing): each choice takes a slot of its expert's capacity.

  The fill order within a group (GShard's and MaxText's): every token's first choice, in the group's order (or
  the same seeded permutation of it as :func:`group_slots` draws), then every token's second choice in that order,
  and so on; an expert's C slots go first come, first served along that sequence, so a k-th choice never takes a
  slot from an earlier choice of any token. k = 1 is :func:`group_slots`.

  Args:
    expert_index: int32 [G, Tg, k], the k (distinct) experts of each token.
    num_experts: E.
    capacity: C, slots per (group, expert), counting choices.
    shuffle_rng: as :func:`group_slots` (one permutation of the tokens per group, shared by their k choices).
    valid: bool [G, Tg] or None: a padding token's choices take no slot and displace no real one.

  Returns:
    int32 [G, Tg, k]: ``expert * C + position`` for a kept choice, ``E * C`` for a dropped (or padding) one.
  """
  groups, group_size, top_k = expert_index.shape
  if top_k == 1:
    return group_slots(expert_index[..., 0], num_experts, capacity, shuffle_rng, valid)[..., None]
  if valid is not None:  # padding queues at an extra expert E, whose slots are then discarded
    slots = choice_slots(jnp.where(valid[..., None], expert_index, num_experts), num_experts + 1, capacity,
                         shuffle_rng)
    return jnp.where(valid[..., None] & (slots < num_experts * capacity), slots,
                     num_experts * capacity).astype(jnp.int32)
  if shuffle_rng is None:
    order = jnp.broadcast_to(jnp.arange(group_size), (groups, group_size))
  else:
    keys = jax.vmap(lambda g: jax.random.fold_in(shuffle_rng, g))(jnp.arange(groups))
    order = jax.vmap(lambda k: jax.random.permutation(k, group_size))(keys)  # [G, Tg]
  ordered = jnp.take_along_axis(expert_index, order[..., None], axis=1)  # [G, Tg, k] in fill order
  sequence = ordered.swapaxes(1, 2).reshape(groups, top_k * group_size)  # choice-major
  ranked = jax.vmap(_positions, in_axes=(0, None))(sequence, num_experts)
  ranked = ranked.reshape(groups, top_k, group_size).swapaxes(1, 2)  # [G, Tg (in fill order), k]
  position = jax.vmap(lambda o, p: jnp.zeros_like(p).at[o].set(p))(order, ranked)
  slot = jnp.where(position < capacity, expert_index * capacity + position, num_experts * capacity)
  return slot.astype(jnp.int32)


def scatter_to_buffers(x: jax.Array, slots: jax.Array, num_experts: int, capacity: int) -> jax.Array:
  """x [Tg, d], slots int32 [Tg] -> [E, C, d]; empty slots are zero, dropped tokens go nowhere."""
  buffer = jnp.zeros((num_experts * capacity + 1, x.shape[-1]), x.dtype)
  buffer = buffer.at[slots].set(x, unique_indices=False)
  return buffer[:-1].reshape(num_experts, capacity, x.shape[-1])


@jax.custom_vjp
def gather_rows(y: jax.Array, index: jax.Array) -> jax.Array:
  """y [N, d], index int32 [T] -> [T, d]: row ``index[t]`` of y, zeros where ``index[t] == N``.

  The indices other than N must be distinct (a slot or row holds at most one token). The backward is
  then a gather as well, not XLA's scatter-add: each row of y takes the cotangent of the one token that
  read it (zero if none did).
  """
  return _gather_rows(y, index)


def _gather_rows(y, index):
  return jnp.concatenate([y, jnp.zeros((1, y.shape[-1]), y.dtype)])[index]


def _inverse_index(index: jax.Array, num_rows: int) -> jax.Array:
  """int32 [T] (values in [0, N]) -> [N]: the t with ``index[t] == n``, or T where none; N is ignored."""
  tokens = index.shape[0]
  return jnp.full((num_rows,), tokens, jnp.int32).at[index].set(jnp.arange(tokens, dtype=jnp.int32), mode="drop")


def _gather_rows_fwd(y, index):
  return _gather_rows(y, index), (index, y.shape[0])


def _gather_rows_bwd(res, ct):
  index, num_rows = res
  return _gather_rows(ct, _inverse_index(index, num_rows)), None


gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


def gather_from_buffers(y: jax.Array, slots: jax.Array) -> jax.Array:
  """y [E, C, d], slots int32 [Tg] -> [Tg, d] in token order; dropped tokens get zeros."""
  return gather_rows(y.reshape(-1, y.shape[-1]), slots)


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


DEFAULT_BLOCK_SIZE = 128


def max_blocks(kept_max: int, num_experts: int, block_size: int) -> int:
  """Most blocks that ``kept_max`` tokens over E experts can fill, each expert's rows padded to a block.

  k non-empty experts holding n_e >= 1 rows each need ``sum ceil(n_e / b) <= k + (kept - k) // b`` blocks,
  largest at k = min(E, kept); never more than ``round_up(kept + E * (b - 1), b) / b``.
  """
  busy = min(num_experts, kept_max)
  return busy + (kept_max - busy) // block_size


def grouped_rows(slots: jax.Array, num_experts: int, capacity: int, block_size: int):
  """Where each kept token goes in expert-sorted rows, each expert's rows padded to a multiple of b.

  Kept tokens are ordered by expert, then by (group, position) - the order of the ``index``
  dispatcher's buffers - without a sort: a token's row is its expert's first row + the kept rows of its
  expert in earlier groups + its position.

  Args:
    slots: int32 [G, Tg] from :func:`group_slots`.
    num_experts: E.
    capacity: C.
    block_size: b, rows per block.

  Returns:
    row: int32 [G * Tg], the token's row in [0, R), or R for a dropped token, R = nb * b;
    block_expert: int32 [nb], the expert of each block, E for an unused trailing block.
  """
  groups, group_size = slots.shape
  num_blocks = max_blocks(min(groups * group_size, groups * num_experts * capacity), num_experts, block_size)
  num_rows = num_blocks * block_size
  expert = slots // capacity  # [G, Tg]; E for dropped tokens
  kept = jnp.sum(jax.nn.one_hot(expert, num_experts, dtype=jnp.int32), axis=1)  # [G, E]; drops are all-zero
  earlier_groups = jnp.cumsum(kept, axis=0) - kept  # [G, E]
  counts = jnp.sum(kept, axis=0)  # [E]
  padded_end = jnp.cumsum((counts + block_size - 1) // block_size * block_size)  # [E]
  expert_start = padded_end - (counts + block_size - 1) // block_size * block_size
  clipped = jnp.minimum(expert, num_experts - 1)
  start = expert_start[clipped] + jnp.take_along_axis(earlier_groups, clipped, axis=1)
  row = jnp.where(expert < num_experts, start + slots % capacity, num_rows)
  block_expert = jnp.searchsorted(padded_end, jnp.arange(num_blocks) * block_size, side="right")
  return row.reshape(-1).astype(jnp.int32), block_expert.astype(jnp.int32)


def _expert_slice(params: Any, expert: jax.Array) -> Any:
  """Leaves [E, ...] -> [1, ...]: one expert's parameters, by a dynamic index."""
  return jax.tree.map(lambda p: jax.lax.dynamic_slice_in_dim(p, expert, 1, axis=0), params)


def _block_experts(expert_fn: ExpertFn, num_experts: int):
  """The expert stack over blocks ``[nb, b, d]``, each block through its own expert, as a custom-VJP function.

  Blocks run one after another (``lax.scan``), an unused block (expert E) is skipped. The backward
  recomputes each block's forward (no per-block copy of the expert's weights is saved) and adds its
  weight gradient into that expert's slice of one ``[E, ...]`` accumulator, in place, where autodiff of
  the scan would add a zero-padded ``[E, ...]`` gradient per block.
  """
  def one_block(params, rows, expert, block, rng):  # rows [b, d]; params [1, ...]
    return expert_fn(params, rows[None, None], expert[None], block[None], rng)[0, 0]

  def forward(params, blocks, block_expert, rng):
    def step(_, inputs):
      rows, expert, block = inputs
      run = lambda: one_block(_expert_slice(params, jnp.minimum(expert, num_experts - 1)), rows, expert, block, rng)
      return None, jax.lax.cond(expert < num_experts, run, lambda: jnp.zeros_like(rows))
    return jax.lax.scan(step, None, (blocks, block_expert, jnp.arange(blocks.shape[0])))[1]

  @jax.custom_vjp
  def run_blocks(params, blocks, block_expert, rng):
    return forward(params, blocks, block_expert, rng)

  def run_blocks_fwd(params, blocks, block_expert, rng):
    return forward(params, blocks, block_expert, rng), (params, blocks, block_expert, rng)

  def run_blocks_bwd(res, ct):
    params, blocks, block_expert, rng = res

    def step(grads, inputs):
      rows, expert, block, ct_rows = inputs
      safe = jnp.minimum(expert, num_experts - 1)

      def run():
        _, vjp = jax.vjp(lambda p, r: one_block(p, r, expert, block, rng), _expert_slice(params, safe), rows)
        return vjp(ct_rows)

      def skip():
        return jax.tree.map(jnp.zeros_like, _expert_slice(params, safe)), jnp.zeros_like(rows)

      grad_p, grad_rows = jax.lax.cond(expert < num_experts, run, skip)
      grads = jax.tree.map(
          lambda acc, g: jax.lax.dynamic_update_slice_in_dim(
              acc, jax.lax.dynamic_slice_in_dim(acc, safe, 1, axis=0) + g, safe, axis=0), grads, grad_p)
      return grads, grad_rows

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, grad_blocks = jax.lax.scan(step, zeros, (blocks, block_expert, jnp.arange(blocks.shape[0]), ct))
    return grads, grad_blocks, None, None

  run_blocks.defvjp(run_blocks_fwd, run_blocks_bwd)
  return run_blocks


def grouped_dispatch(x, slots, expert_params, rng, *, expert_fn, num_experts, capacity,
                     block_size=DEFAULT_BLOCK_SIZE):
  """The ``index`` dispatcher's tokens (same slots, same drops) on expert-sorted rows, computing real rows only.

  All groups' kept tokens go to rows sorted by expert, each expert's padded to a multiple of
  ``b = min(block_size, kept tokens at most)``; blocks of b rows (``[nb, b, d]``, nb from
  :func:`max_blocks`) run through their expert one by one, so the experts compute about the routed rows
  plus < b per expert, not E * C per group. Dropped tokens get zeros. Dropout masks are drawn per
  (expert, block, sublayer), so they differ from ``index``'s; without dropout the outputs are the same.
  The backward recomputes each block's forward (see :func:`_block_experts`): in training it pays off
  when capacity buffers are mostly empty (cf 2), not at cf 1. Single device or GSPMD only (no expert
  parallelism).
  """
  groups, group_size, d = x.shape
  block_size = max(1, min(block_size, groups * group_size, groups * num_experts * capacity))
  row, block_expert = grouped_rows(slots, num_experts, capacity, block_size)
  num_rows = block_expert.shape[0] * block_size
  source = _inverse_index(row, num_rows)  # [R]: the token of each row, T for padding
  blocks = gather_rows(x.reshape(-1, d), source).reshape(-1, block_size, d)
  y = _block_experts(expert_fn, num_experts)(expert_params, blocks, block_expert, rng)
  return gather_rows(y.reshape(num_rows, d), row).reshape(groups, group_size, d)


DISPATCHERS: dict[str, Dispatcher] = {
    "index": index_dispatch,
    "all_to_all": all_to_all_dispatch,
    "one_hot": one_hot_dispatch,
    "grouped": grouped_dispatch,
}
DISPATCHER_NAMES = ("auto", *DISPATCHERS)
SINGLE_DEVICE_DISPATCHERS = ("grouped",)  # no expert parallelism: refused when the mesh's expert axis is > 1


def _expert_devices() -> int:
  return jax.sharding.get_abstract_mesh().shape.get(sharding_lib.EXPERT_AXIS, 1)


def resolve_dispatcher_name(name: str, *, eval_name: str | None = None, no_drops: bool = False,
                            backend: str | None = None) -> str:
  """The dispatcher a layer uses: ``model.moe.dispatcher`` (``name``), or in evaluation ``eval_name``.

  ``name`` "auto": all_to_all when the mesh's ``expert`` axis is > 1, else index. ``eval_name`` "auto":
  grouped when evaluation drops no token (``no_drops``), there is no expert axis > 1 and the backend
  (default: JAX's) is the CPU, else as training. On a GPU the grouped dispatcher's block loop ran 6-18x
  slower than index dispatch at capacity factor 1 and 2 (H100, lm_base and lm_large layer shapes,
  ``benchmarks/results/gpu/``), so there no-drop evaluation keeps index dispatch.
  """
  experts_split = _expert_devices() > 1
  if eval_name is not None and eval_name != "auto":
    name = eval_name
  elif eval_name == "auto" and no_drops and not experts_split and (backend or jax.default_backend()) == "cpu":
    name = "grouped"
  if name == "auto":
    name = "all_to_all" if experts_split else "index"
  if name not in DISPATCHERS:
    raise ValueError(f"unknown dispatcher {name!r}; choose one of {DISPATCHER_NAMES}")
  if name in SINGLE_DEVICE_DISPATCHERS and experts_split:
    raise ValueError(f"the {name} dispatcher has no expert parallelism, but the mesh's expert axis is "
                     f"{_expert_devices()}; use dispatcher all_to_all (or auto), or mesh.expert=1.")
  return name


def choose_dispatcher(name: str, *, eval_name: str | None = None, no_drops: bool = False,
                      block_size: int = DEFAULT_BLOCK_SIZE) -> Dispatcher:
  """``model.moe.dispatcher`` (and in evaluation ``model.moe.eval_dispatcher``) -> a dispatcher.

  See :func:`resolve_dispatcher_name`; ``block_size`` is the grouped dispatcher's row block.
  """
  name = resolve_dispatcher_name(name, eval_name=eval_name, no_drops=no_drops)
  if name == "grouped":
    return functools.partial(grouped_dispatch, block_size=block_size)
  return DISPATCHERS[name]

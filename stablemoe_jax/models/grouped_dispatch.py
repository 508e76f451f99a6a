"""The ``grouped`` dispatcher: the ``index`` dispatcher's slots on expert-sorted rows, computing real rows only.

All groups' kept tokens go to R rows sorted by expert (:func:`grouped_rows`), each expert's rows padded to a
block of b; the nb blocks run through their own expert one after another, under a custom VJP
(:func:`_block_experts`): about the routed rows' FLOPs instead of ``N * C`` rows per group. The CPU's evaluation
default when nothing is dropped (``dispatch.resolve_dispatcher_name``); on a GPU its block loop is far slower than
``index``. Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from stablemoe_jax.models.buffers import gather_rows, inverse_index

DEFAULT_BLOCK_SIZE = 128


def max_blocks(kept_max: int, num_experts: int, block_size: int) -> int:
  """Most blocks that ``kept_max`` tokens over N experts can fill, each expert's rows padded to a block.

  m non-empty experts holding n_e >= 1 rows each need ``sum ceil(n_e / b) <= m + (kept - m) // b`` blocks,
  largest at m = min(N, kept); never more than ``round_up(kept + N * (b - 1), b) / b``.
  """
  busy = min(num_experts, kept_max)
  return busy + (kept_max - busy) // block_size


def grouped_rows(slots: jax.Array, num_experts: int, capacity: int, block_size: int):
  """Where each kept token goes in expert-sorted rows, each expert's rows padded to a multiple of b.

  Kept tokens are ordered by expert, then by (group, position) - the order of the ``index``
  dispatcher's buffers - without a sort: a token's row is its expert's first row + the kept rows of its
  expert in earlier groups + its position.

  Args:
    slots: int32 [G, Tg] from ``capacity.group_slots``.
    num_experts: N.
    capacity: C.
    block_size: b, rows per block.

  Returns:
    row: int32 [G * Tg], the token's row in [0, R), or R for a dropped token, R = nb * b;
    block_expert: int32 [nb], the expert of each block, N for an unused trailing block.
  """
  groups, group_size = slots.shape
  num_blocks = max_blocks(min(groups * group_size, groups * num_experts * capacity), num_experts, block_size)
  num_rows = num_blocks * block_size
  expert = slots // capacity  # [G, Tg]; N for dropped tokens
  kept = jnp.sum(jax.nn.one_hot(expert, num_experts, dtype=jnp.int32), axis=1)  # [G, N]; drops are all-zero
  earlier_groups = jnp.cumsum(kept, axis=0) - kept  # [G, N]
  counts = jnp.sum(kept, axis=0)  # [N]
  padded_end = jnp.cumsum((counts + block_size - 1) // block_size * block_size)  # [N]
  expert_start = padded_end - (counts + block_size - 1) // block_size * block_size
  clipped = jnp.minimum(expert, num_experts - 1)
  start = expert_start[clipped] + jnp.take_along_axis(earlier_groups, clipped, axis=1)
  row = jnp.where(expert < num_experts, start + slots % capacity, num_rows)
  block_expert = jnp.searchsorted(padded_end, jnp.arange(num_blocks) * block_size, side="right")
  return row.reshape(-1).astype(jnp.int32), block_expert.astype(jnp.int32)


def _expert_slice(params: Any, expert: jax.Array) -> Any:
  """Leaves [N, ...] -> [1, ...]: one expert's parameters, by a dynamic index."""
  return jax.tree.map(lambda p: jax.lax.dynamic_slice_in_dim(p, expert, 1, axis=0), params)


def _block_experts(expert_fn: Callable[..., jax.Array], num_experts: int):
  """The expert stack over blocks ``[nb, b, d]``, each block through its own expert, as a custom-VJP function.

  Blocks run one after another (``lax.scan``), an unused block (expert N) is skipped. The backward
  recomputes each block's forward (no per-block copy of the expert's weights is saved) and adds its
  weight gradient into that expert's slice of one ``[N, ...]`` accumulator, in place, where autodiff of
  the scan would add a zero-padded ``[N, ...]`` gradient per block.
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
  plus < b per expert, not N * C per group. Dropped tokens get zeros. Dropout masks are drawn per
  (expert, block, sublayer), so they differ from ``index``'s; without dropout the outputs are the same.
  The backward recomputes each block's forward (see :func:`_block_experts`): in training it pays off
  when capacity buffers are mostly empty (cf 2), not at cf 1. Single device or GSPMD only (no expert
  parallelism).
  """
  groups, group_size, d = x.shape
  block_size = max(1, min(block_size, groups * group_size, groups * num_experts * capacity))
  row, block_expert = grouped_rows(slots, num_experts, capacity, block_size)
  num_rows = block_expert.shape[0] * block_size
  source = inverse_index(row, num_rows)  # [R]: the token of each row, G * Tg for padding
  blocks = gather_rows(x.reshape(-1, d), source).reshape(-1, block_size, d)
  y = _block_experts(expert_fn, num_experts)(expert_params, blocks, block_expert, rng)
  return gather_rows(y.reshape(num_rows, d), row).reshape(groups, group_size, d)

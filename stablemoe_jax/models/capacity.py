"""Capacity slots: which of its expert's C slots each token (each choice, with top-k) takes in its routing group.

Tokens are routed in G groups of ``Tg = T / G`` consecutive tokens; each (group, expert) pair has C slots
(:func:`expert_capacity`: ``ceil(cf * k * Tg / N)``, MaxText's ``generate_masks`` convention, so a capacity
factor means the same slack for every k), filled first come, first served in the group's order, or in a seeded permutation of
it, so that an overflowing expert drops random tokens (:func:`group_slots`). With top-k routing every choice
takes a slot: all first choices in that order, then all second choices (:func:`choice_slots`). A slot is
``expert * C + position`` in the group's flattened ``[N * C]`` buffer; ``N * C`` marks a dropped token (it gets
zeros back, and the MoE layer passes it through). The dispatchers (``dispatch.py``) move the tokens to these
slots. A run depends on G, never on how many devices share it. Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def expert_capacity(num_tokens: int, num_experts: int, capacity_factor: float, top_k: int = 1) -> int:
  """``ceil(capacity_factor * k * T / N)``, at least 1, at most T; ``capacity_factor <= 0`` means no limit (T).

  Capacity counts choices: T tokens of k choices each fill ``k * T`` slots, so the slots an expert gets scale with
  k (MaxText's ``tokens_per_batch = seq_len * num_experts_per_tok``; GShard's top-2 ``2 T / N``) and a capacity
  factor of 1 has room for every choice of a balanced layer whatever k. T caps it: a token chooses an expert at
  most once. With routing groups, ``num_tokens`` is the group size ``T / G``.
  """
  if capacity_factor <= 0:
    return num_tokens
  return max(1, min(num_tokens, math.ceil(capacity_factor * top_k * num_tokens / num_experts)))


def _positions(expert_index: jax.Array, num_experts: int) -> jax.Array:
  """int32 [Tg] -> [Tg]: how many earlier tokens of the group chose the same expert."""
  assigned = jax.nn.one_hot(expert_index, num_experts, dtype=jnp.int32)  # [Tg, N]
  return jnp.sum(jnp.cumsum(assigned, axis=0) * assigned, axis=-1) - 1


def group_slots(expert_index: jax.Array, num_experts: int, capacity: int,
                shuffle_rng: jax.Array | None = None, valid: jax.Array | None = None) -> jax.Array:
  """Slot of every token in its group's flattened ``[N * C]`` buffer.

  Args:
    expert_index: int32 [G, Tg], the expert of each token, groups along the first axis.
    num_experts: N.
    capacity: C, slots per (group, expert).
    shuffle_rng: if given, positions are assigned in a random order within each group (one
      permutation per group from ``fold_in(shuffle_rng, group)``), so overflow drops random tokens.
    valid: bool [G, Tg] or None: tokens with False (padding) take no slot and displace no real token.

  Returns:
    int32 [G, Tg]: ``expert * C + position`` for kept tokens, ``N * C`` for dropped (or invalid) ones.
  """
  groups, group_size = expert_index.shape
  if valid is not None:  # padding queues at an extra expert N, whose slots are then discarded
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
    num_experts: N.
    capacity: C, slots per (group, expert), counting choices.
    shuffle_rng: as :func:`group_slots` (one permutation of the tokens per group, shared by their k choices).
    valid: bool [G, Tg] or None: a padding token's choices take no slot and displace no real one.

  Returns:
    int32 [G, Tg, k]: ``expert * C + position`` for a kept choice, ``N * C`` for a dropped (or padding) one.
  """
  groups, group_size, top_k = expert_index.shape
  if top_k == 1:
    return group_slots(expert_index[..., 0], num_experts, capacity, shuffle_rng, valid)[..., None]
  if valid is not None:  # padding queues at an extra expert N, whose slots are then discarded
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

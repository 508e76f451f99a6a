"""Balanced linear assignment (BASE Layers) by an epsilon-scaled auction, inside jit.

Problem: T tokens, N experts, affinities ``a [T, N]``; give every expert exactly
``C = T / N`` tokens and maximise ``sum_t a[t, e_t]``. Each expert is C identical
"copies" (slots), each with its own price; this is Bertsekas' auction for
similar objects, run Jacobi-style (all unassigned tokens bid at once):

- an unassigned token t bids for the expert j maximising ``a[t, j] - p_j``
  (``p_j`` = price of j's cheapest slot), raising that slot's price by
  ``w1 - w2 + eps``, where w1 is that best value and w2 the second best over all
  other slots (other experts' cheapest slots and j's second-cheapest one);
- each expert keeps the C highest prices among its slots and the new bids;
  displaced holders become unassigned.

Every bid keeps epsilon-complementary slackness (a token's slot is within eps
of its best slot at the current prices, and prices only rise), so a complete
assignment has total affinity >= optimum - T * eps (Bertsekas, 1988). Epsilon
is scaled down by 8 per phase to ``eps_final = epsilon * span``,
span = max(a) - min(a), keeping prices between phases. The prices start from a Sinkhorn
(entropic) estimate of the dual prices, which leaves the auction only the last
corrections (the bound holds whatever the starting prices). If ``max_rounds`` rounds
of a phase do not assign every token (not seen in practice), the remaining
tokens fill the remaining slots in token order: the balance is always exact,
the bound then no longer holds (``converged`` says so).
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations



import jax
import jax.numpy as jnp

SCALING_FACTOR = 8.0


def _phase(a, slot_price, eps, max_rounds):
  """One auction phase from empty slots at the given prices: -> (slot_price, slot_owner, rounds)."""
  num_tokens, num_experts = a.shape
  capacity = slot_price.shape[1]
  token_ids = jnp.arange(num_tokens)
  expert_ids = jnp.arange(num_experts)

  def cond(carry):
    _, _, owner, rounds = carry
    return jnp.any(owner < 0) & (rounds < max_rounds)

  def body(carry):
    slot_price, slot_owner, owner, rounds = carry
    sorted_price = jnp.sort(slot_price, axis=1)
    cheapest = sorted_price[:, 0]
    second = sorted_price[:, 1] if capacity > 1 else jnp.full((num_experts,), jnp.inf)
    value = a - cheapest[None]  # [T, N]
    best = jnp.argmax(value, axis=1)
    w1 = jnp.max(value, axis=1)
    chosen = best[:, None] == expert_ids[None]
    w_other = jnp.max(jnp.where(chosen, -jnp.inf, value), axis=1)
    a_best = jnp.take_along_axis(a, best[:, None], axis=1)[:, 0]
    w2 = jnp.maximum(w_other, a_best - second[best])
    w2 = jnp.where(jnp.isfinite(w2), w2, w1)
    bid = a_best - w2 + eps
    bidding = (owner < 0)[:, None] & chosen  # [T, N]
    bids = jnp.where(bidding, bid[:, None], -jnp.inf).T  # [N, T]
    candidates = jnp.concatenate([slot_price, bids], axis=1)  # [N, C + T]
    candidate_owner = jnp.concatenate([slot_owner, jnp.broadcast_to(token_ids, (num_experts, num_tokens))], axis=1)
    new_price, top = jax.lax.top_k(candidates, capacity)
    new_owner = jnp.take_along_axis(candidate_owner, top, axis=1)
    held = jnp.where(new_owner >= 0, new_owner, num_tokens)
    owner = jnp.full((num_tokens,), -1, jnp.int32).at[held.reshape(-1)].set(
        jnp.repeat(expert_ids, capacity).astype(jnp.int32), mode="drop")
    return new_price, new_owner, owner, rounds + 1

  slot_owner = jnp.full(slot_price.shape, -1, jnp.int32)
  owner = jnp.full((num_tokens,), -1, jnp.int32)
  slot_price, slot_owner, owner, rounds = jax.lax.while_loop(
      cond, body, (slot_price, slot_owner, owner, jnp.zeros((), jnp.int32)))
  return slot_price, slot_owner, owner, rounds


def _fill_remaining(slot_owner, owner):
  """Puts the still-unassigned tokens into the still-empty slots, in order: exact balance in every case."""
  num_experts, capacity = slot_owner.shape
  free = slot_owner.reshape(-1) < 0
  waiting = owner < 0
  free_rank = jnp.cumsum(free) - 1
  slot_of_rank = jnp.zeros(free.shape, jnp.int32).at[jnp.where(free, free_rank, free.size)].set(
      jnp.arange(free.size, dtype=jnp.int32), mode="drop")
  waiting_rank = jnp.cumsum(waiting) - 1
  expert_of_slot = jnp.arange(free.size, dtype=jnp.int32) // capacity
  return jnp.where(waiting, expert_of_slot[slot_of_rank[jnp.maximum(waiting_rank, 0)]], owner)


def sinkhorn_prices(a: jax.Array, temperature: jax.Array, iterations: int) -> jax.Array:
  """Entropic (Sinkhorn) estimate of the experts' dual prices: a [T, N] -> float32 [N].

  Starting the auction from these prices leaves it only the last corrections to make;
  the auction's optimality bound does not depend on where its prices start.
  """
  num_tokens, num_experts = a.shape
  log_capacity = jnp.log(num_tokens / num_experts)

  def step(prices, _):
    u = temperature * jax.nn.logsumexp((a - prices[None]) / temperature, axis=1)  # [T]
    prices = temperature * (jax.nn.logsumexp((a - u[:, None]) / temperature, axis=0) - log_capacity)
    return prices, None

  prices, _ = jax.lax.scan(step, jnp.zeros((num_experts,), jnp.float32), None, length=iterations)
  return prices - jnp.min(prices)


def balanced_assignment(scores: jax.Array, epsilon: float = 1e-2, max_rounds: int = 1000, phases: int = 1,
                        sinkhorn_iterations: int = 200, sinkhorn_sharpness: float = 300.0):
  """Maximum-affinity assignment with exactly T / N tokens per expert.

  Args:
    scores: float [T, N] affinities (no gradient flows through the result); T divisible by N.
    epsilon: final bid increment relative to the score span; total affinity is within
      ``T * epsilon * span`` of the optimum when ``converged``.
    max_rounds: bidding rounds allowed per epsilon phase.
    phases: epsilon phases, from ``epsilon * 8 ** (phases - 1)`` down to ``epsilon`` (times the span).
    sinkhorn_iterations: Sinkhorn iterations that estimate the starting prices.
    sinkhorn_sharpness: the Sinkhorn temperature is span / sinkhorn_sharpness.

  Returns:
    (expert_index int32 [T], info dict: rounds int32 (all phases), converged bool, eps_final float32).
  """
  num_tokens, num_experts = scores.shape
  if num_tokens % num_experts:
    raise ValueError(f"balanced assignment needs tokens ({num_tokens}) divisible by experts ({num_experts})")
  capacity = num_tokens // num_experts
  a = jax.lax.stop_gradient(scores).astype(jnp.float32)
  span = jnp.maximum(jnp.max(a) - jnp.min(a), 1e-6)
  prices = sinkhorn_prices(a, span / sinkhorn_sharpness, sinkhorn_iterations)
  slot_price = jnp.broadcast_to(prices[:, None], (num_experts, capacity))
  rounds_total = jnp.zeros((), jnp.int32)
  for k in range(phases):
    eps = span * epsilon * SCALING_FACTOR ** (phases - 1 - k)
    slot_price, slot_owner, owner, rounds = _phase(a, slot_price, eps, max_rounds)
    rounds_total = rounds_total + rounds
  converged = jnp.all(owner >= 0)
  expert_index = _fill_remaining(slot_owner, owner)
  return expert_index, {"rounds": rounds_total, "converged": converged, "eps_final": span * epsilon}

"""Greedy and beam search over any cached step function, as one jittable ``lax.while_loop`` of fixed shapes.

A step function ``step_fn(tokens int32 [N], cache, position) -> (log_probs float32 [N, V], cache)`` scores the
next token of N rows given their last token (the cache holds the rest). Both searches generate positions
0 .. max_len - 1 after bos, never emit the ``forbidden`` ids (pad, bos), and force eos at the last position,
so every hypothesis ends with eos within ``max_len`` tokens (fairseq's rules).

Beam search follows fairseq's ``sequence_generator``: each step ranks 2K candidates; eos candidates among
the first K ranks are finished, the first K others stay live; a sentence is done once it has K finished
hypotheses. A finished hypothesis of n tokens (eos included) with log-probability sum s scores
``s / n ** length_penalty`` (fairseq's ``lenpen``; 0: the raw sum). Beam size 1 is then greedy search.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

NEG_INF = -1.0e9  # the score of an impossible candidate (finite: no inf - inf)
StepFn = Callable[[jax.Array, Any, jax.Array], tuple[jax.Array, Any]]


def _allowed(log_probs: jax.Array, position: jax.Array, max_len: int, eos_id: int,
             forbidden: Sequence[int]) -> jax.Array:
  """log_probs [..., V] with the forbidden ids, and at the last position every id but eos, set to NEG_INF."""
  ids = jnp.arange(log_probs.shape[-1])
  banned = jnp.isin(ids, jnp.asarray(forbidden, jnp.int32)) | ((position == max_len - 1) & (ids != eos_id))
  return jnp.where(banned, NEG_INF, log_probs)


def greedy_search(step_fn: StepFn, cache: Any, batch_size: int, max_len: int, bos_id: int, eos_id: int,
                  pad_id: int, forbidden: Sequence[int]) -> tuple[jax.Array, jax.Array]:
  """Returns tokens int32 [B, max_len] (eos, then pad) and their log-probability sums float32 [B]."""
  def cond(state):
    position, _, _, finished, _, _ = state
    return (position < max_len) & ~jnp.all(finished)

  def body(state):
    position, last, tokens, finished, scores, cache = state
    log_probs, cache = step_fn(last, cache, position)
    log_probs = _allowed(log_probs.astype(jnp.float32), position, max_len, eos_id, forbidden)
    chosen = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
    scores = scores + jnp.where(finished, 0.0, jnp.take_along_axis(log_probs, chosen[:, None], axis=-1)[:, 0])
    chosen = jnp.where(finished, pad_id, chosen)
    tokens = jax.lax.dynamic_update_slice(tokens, chosen[:, None], (0, position))
    return position + 1, chosen, tokens, finished | (chosen == eos_id), scores, cache

  state = (jnp.array(0, jnp.int32), jnp.full((batch_size,), bos_id, jnp.int32),
           jnp.full((batch_size, max_len), pad_id, jnp.int32), jnp.zeros((batch_size,), bool),
           jnp.zeros((batch_size,), jnp.float32), cache)
  _, _, tokens, _, scores, _ = jax.lax.while_loop(cond, body, state)
  return tokens, scores


def _gather_rows(tree: Any, rows: jax.Array) -> Any:
  """Every non-scalar leaf [B * K, ...] -> leaf[rows] (rows int32 [B * K]); scalars (cache indices) unchanged."""
  return jax.tree.map(lambda x: x if x.ndim == 0 else jnp.take(x, rows, axis=0), tree)


def beam_search(step_fn: StepFn, cache: Any, batch_size: int, beam_size: int, max_len: int, bos_id: int,
                eos_id: int, pad_id: int, forbidden: Sequence[int], length_penalty: float = 1.0
                ) -> tuple[jax.Array, jax.Array]:
  """Returns the finished hypotheses int32 [B, K, max_len] (best first) and their scores float32 [B, K].

  ``cache``: the step function's cache for B * K rows, row b * K + k being sentence b's beam k (all K rows of
  a sentence start equal: its encoder output repeated).
  """
  B, K, L = batch_size, beam_size, max_len
  rank = jnp.arange(2 * K)

  def cond(state):
    position, _, _, _, _, done, _ = state
    return (position < L) & ~jnp.all(done)

  def body(state):
    position, live_seqs, live_logp, fin_seqs, fin_scores, done, cache = state
    last = jnp.where(position == 0, bos_id, jnp.take(live_seqs, jnp.maximum(position - 1, 0), axis=2))
    log_probs, cache = step_fn(last.reshape(B * K), cache, position)
    log_probs = _allowed(log_probs.astype(jnp.float32).reshape(B, K, -1), position, L, eos_id, forbidden)
    vocab = log_probs.shape[-1]
    candidates = (live_logp[:, :, None] + log_probs).reshape(B, K * vocab)
    top_logp, top_index = jax.lax.top_k(candidates, 2 * K)  # [B, 2K], best first
    beam, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    top_seqs = jnp.take_along_axis(live_seqs, beam[:, :, None], axis=1)
    top_seqs = jax.lax.dynamic_update_slice(top_seqs, token[:, :, None], (0, 0, position))
    is_eos = token == eos_id
    valid = top_logp > NEG_INF / 2
    finishing = is_eos & valid & (rank < K)[None] & ~done[:, None]
    lengths = (position + 1).astype(jnp.float32)
    new_scores = jnp.where(finishing, top_logp / lengths**length_penalty, NEG_INF)
    fin_scores, keep = jax.lax.top_k(jnp.concatenate([fin_scores, new_scores], axis=1), K)
    fin_seqs = jnp.take_along_axis(jnp.concatenate([fin_seqs, top_seqs], axis=1), keep[:, :, None], axis=1)
    live_logp, live = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logp), K)
    live_seqs = jnp.take_along_axis(top_seqs, live[:, :, None], axis=1)
    source_beam = jnp.take_along_axis(beam, live, axis=1)  # [B, K]
    cache = _gather_rows(cache, (jnp.arange(B)[:, None] * K + source_beam).reshape(-1))
    done = done | (jnp.sum(fin_scores > NEG_INF / 2, axis=1) >= K)
    return position + 1, live_seqs, live_logp, fin_seqs, fin_scores, done, cache

  live_logp = jnp.tile(jnp.where(jnp.arange(K) == 0, 0.0, NEG_INF)[None], (B, 1))  # one live beam at first
  state = (jnp.array(0, jnp.int32), jnp.full((B, K, L), pad_id, jnp.int32), live_logp,
           jnp.full((B, K, L), pad_id, jnp.int32), jnp.full((B, K), NEG_INF, jnp.float32),
           jnp.zeros((B,), bool), cache)
  _, _, _, fin_seqs, fin_scores, _, _ = jax.lax.while_loop(cond, body, state)
  return fin_seqs, fin_scores

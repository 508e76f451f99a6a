"""Hash Layers' router (Roller et al., 2021): a fixed token-id -> expert table, gate 1, no loss. The table is seeded
random, or ``balanced``: bin-packed by the training split's token counts once, at initialisation.

Its settings are the section ``model.moe.hash`` (``core.settings.HashSettings``); ``models/routers.py`` registers it.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from stablemoe_jax.models.routing import Routing


def random_hash_table(vocab_size: int, num_experts: int, seed: int) -> np.ndarray:
  """A seeded uniformly random token-id -> expert table: int32 [V]."""
  return np.random.default_rng(seed).integers(0, num_experts, vocab_size).astype(np.int32)


def balanced_hash_table(token_counts: np.ndarray, num_experts: int, seed: int) -> np.ndarray:
  """Greedy bin packing by frequency (Hash Layers' "balanced" hash): int32 [V] from counts [V].

  Token ids in decreasing count order (ties in a seeded random order) go one by one to the expert
  with the fewest training tokens so far (the lowest index among equals).
  """
  counts = np.asarray(token_counts, np.int64)
  tie_break = np.random.default_rng(seed).permutation(counts.size)
  order = np.lexsort((tie_break, -counts))
  table = np.zeros(counts.size, np.int32)
  load = np.zeros(num_experts, np.int64)
  for token in order:
    expert = int(np.argmin(load))
    table[token] = expert
    load[expert] += counts[token]
  return table


class HashRouter(nn.Module):
  """Hash Layer: expert = table[token id], gate 1, no loss.

  The table is a float32 parameter ``table [V]`` holding expert ids: it has no
  gradient, so Adam leaves it bit-identical, and it is saved and restored with the
  checkpoint. It starts as a seeded random table; for the balanced variant
  ``routers.fill_tables_from_data`` (``fill_from_data`` below) overwrites it once, at initialisation, from the
  training split's token counts.
  """

  num_experts: int
  vocab_size: int
  seed: int = 0

  @nn.compact
  def __call__(self, h: jax.Array, token_ids: jax.Array, in_stage1: jax.Array,
               deterministic: bool = True, token_mask: jax.Array | None = None) -> Routing:
    del in_stage1, deterministic, token_mask
    table = self.param(
        "table", lambda _, shape: jnp.asarray(random_hash_table(shape[0], self.num_experts, self.seed), jnp.float32),
        (self.vocab_size,))
    expert_index = jnp.take(jax.lax.stop_gradient(table), token_ids.reshape(-1)).astype(jnp.int32)
    return Routing.top1(expert_index, jnp.ones(expert_index.shape, h.dtype))


def build(settings, *, moe, num_experts: int, vocab_size: int) -> nn.Module:
  """The router of ``model.moe.hash`` (``settings``), named "router"."""
  del moe
  return HashRouter(num_experts=num_experts, vocab_size=vocab_size, seed=settings.seed, name="router", parent=None)


def check(s, moe) -> list[str]:
  """The problems of the section ``model.moe.hash``, one message each."""
  del moe
  if s.table not in ("random", "balanced"):
    return [f"model.moe.hash.table={s.table!r} is unknown; choose 'random' or 'balanced'."]
  return []


def fill_from_data(router_params, settings, num_experts, token_counts):
  """The balanced table from the training split's token counts (``token_counts()``, int [V]); random: unchanged."""
  if settings.table != "balanced":
    return router_params
  table = balanced_hash_table(token_counts(), num_experts, settings.seed)
  return {**router_params, "table": jnp.asarray(table, jnp.float32)}

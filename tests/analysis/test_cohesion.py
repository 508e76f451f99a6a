"""analysis/cohesion.py's gate rule at its edge: a token is declined when its largest gate is under LOW_GATE (0.01);
exactly 0.01 is not, top-1 and top-k alike."""
from __future__ import annotations

import numpy as np
import pytest

from stablemoe_jax.analysis import cohesion
from stablemoe_jax.models.routing import LOW_GATE

BELOW, ABOVE = np.nextafter(LOW_GATE, 0.0), np.nextafter(LOW_GATE, 1.0)  # the float64 neighbours of 0.01


def _stats(expert_index, gate, mask=None):
  counts = cohesion.RoutingCounts(num_experts=3, vocab_size=5)
  counts.add(token_ids=np.arange(len(expert_index)) % 5, expert_index=expert_index, gate=gate, mask=mask)
  return counts.load_stats()


def test_top1_gate_exactly_at_low_gate_is_not_low_and_just_under_it_is():
  assert LOW_GATE == 0.01
  stats = _stats([0, 1, 2, 0], [LOW_GATE, BELOW, ABOVE, 0.5])
  assert stats["low_gate_fraction"] == 1 / 4  # only the gate just under 0.01
  assert stats["mean_gate"] == pytest.approx((LOW_GATE + BELOW + ABOVE + 0.5) / 4)


def test_top_k_reads_the_largest_gate_at_the_edge():
  # Token 0: largest exactly 0.01 (its first choice's gate under it): not low. Token 1: largest just under 0.01:
  # low. Token 2: first choice just under, second just over: not low. Token 3 is padding (its gates are low).
  stats = _stats([[0, 1], [1, 2], [2, 0], [0, 2]], [[0.001, LOW_GATE], [BELOW, 0.002], [BELOW, ABOVE], [0.0, 0.0]],
                 mask=[True, True, True, False])
  assert stats["tokens"] == 3 and stats["low_gate_fraction"] == 1 / 3
  assert stats["mean_gate"] == pytest.approx((LOW_GATE + BELOW + ABOVE) / 3)


def test_float32_gates_at_low_gate():
  # The layer sows float32 gates: float32(0.01) is a little over 0.01, its lower neighbour under it.
  gate32 = np.float32(LOW_GATE)
  stats = _stats([0, 1], np.array([gate32, np.nextafter(gate32, np.float32(0))], np.float32))
  assert stats["low_gate_fraction"] == 1 / 2


def test_no_gates_counts_tokens_and_load_only():
  stats = _stats([0, 0, 1, 2], None)
  assert stats["tokens"] == 4 and stats["load"] == pytest.approx([0.5, 0.25, 0.25])
  assert stats["low_gate_fraction"] == 0.0 and stats["mean_gate"] == 0.0

"""models/routing.py's health metrics for top-k routing at their edges: each token's largest gate against LOW_GATE
(float32, as the layer sows it; exactly 0.01 is not low), and padding counted nowhere, its k choices included."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stablemoe_jax.models.routing import LOW_GATE, expert_load, routing_health

AT = np.float32(LOW_GATE)  # the float32 nearest 0.01, as a layer's gates hold it
UNDER = np.nextafter(AT, np.float32(0))
INDEX = np.array([[0, 1], [2, 0], [1, 2], [3, 0], [0, 3]], np.int32)
GATES = np.array([[0.001, AT], [UNDER, 0.002], [0.6, 0.4], [0.003, UNDER], [0.9, 0.1]], np.float32)
WEIGHTS = np.array([1.0, 0.0, 1.0, 1.0, 0.0], np.float32)  # tokens 1 and 4 are padding
REAL = WEIGHTS > 0


def test_top_k_low_gates_read_the_largest_gate_at_the_edge():
  metrics = jax.device_get(routing_health(jnp.asarray(INDEX), jnp.asarray(GATES), 4))
  # Largest gates: AT (not low), UNDER (low), 0.6, UNDER (low), 0.9.
  assert metrics["low_gate_fraction"] == pytest.approx(2 / 5)
  assert metrics["mean_gate"] == pytest.approx((AT + UNDER + 0.6 + UNDER + 0.9) / 5, rel=1e-6)


def test_padding_counts_nowhere_with_k_choices():
  masked = jax.device_get(routing_health(jnp.asarray(INDEX), jnp.asarray(GATES), 4, jnp.asarray(WEIGHTS)))
  alone = jax.device_get(routing_health(jnp.asarray(INDEX[REAL]), jnp.asarray(GATES[REAL]), 4))
  for name, value in alone.items():
    np.testing.assert_allclose(masked[name], value, rtol=1e-6, err_msg=name)
  # By hand: the real tokens' 6 choices are 0, 1, 1, 2, 3, 0; their largest gates AT, 0.6, UNDER.
  np.testing.assert_allclose(expert_load(jnp.asarray(INDEX), 4, jnp.asarray(WEIGHTS)), [2 / 6, 2 / 6, 1 / 6, 1 / 6],
                             rtol=1e-6)
  assert masked["low_gate_fraction"] == pytest.approx(1 / 3)

"""Router health for top-k: the verdict's gate range of a top-2 router and a planted collapse of a top-2 layer."""
import jax.numpy as jnp
import numpy as np

from stablemoe_jax.models.routing import STATS, layer_stats
from stablemoe_jax.core.settings import from_config
from tests.models.topk_reference import D, E, init_layer, moe_config


# --- health: the verdict's gate range and a planted collapse of the top-2 router ------------------------------------

def _guard_settings(**moe_changes):
  from configs import default
  from stablemoe_jax.train import health
  config = default.get_config()
  config.train.warmup_steps = 10
  config.health.patience = 1
  for key, value in moe_changes.items():
    target = config.model.moe
    *sections, name = key.split(".")
    for section in sections:
      target = target[section]
    target[name] = value
  return health.GuardSettings.from_settings(from_config(config))


def test_top2_gate_range_is_one_over_k_to_one():
  from stablemoe_jax.train import health
  settings = _guard_settings(router="switch", **{"switch.top_k": 2})
  assert (settings.gate, settings.top_k) == ("softmax", 2)
  assert health.gate_range(settings, {}) == (0.5, 1.0)  # the first of two renormalised probabilities
  assert health.gate_range(_guard_settings(router="switch"), {}) == (1 / 8, 1.0)  # top-1: 1/N
  guard = health.CollapseGuard(settings, start_step=10)
  found = guard.observe(20, {"moe/moe_0/mean_gate": 0.505, "moe/moe_0/load_balance": 0.9, "moe/moe_0/load": [0.125] * 8})
  assert [c.dead for c in found] == [False]
  assert "sits 1.0% of the way up the range its router can reach [0.500, 1.000]" in found[0].message()


def test_planted_collapse_of_a_top2_layer_is_caught_from_its_own_metrics():
  # Centroids that send every token's two choices to experts 0 and 1: the layer's own sown load (over choices)
  # puts 100% on the two busiest of its 4 experts, and the verdict's degenerate-routing rule fires on that window.
  from stablemoe_jax.train import health
  cfg = moe_config(capacity_factor=0.0)
  layer, params, x, ids = init_layer(cfg)
  x = jnp.abs(x) + 1.0
  params["router"]["centroids"] = jnp.zeros((E, D)).at[0].set(10.0).at[1].set(9.0)
  _, sown = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False, mutable=[STATS])
  window = {f"moe/moe_0/{name}": np.asarray(value).tolist()
            for name, value in layer_stats(sown)[""].metrics().items() if name in (*health.HEALTH_METRICS, "load")}
  np.testing.assert_allclose(window["moe/moe_0/load"], [0.5, 0.5, 0, 0])
  settings = _guard_settings(router="switch", num_experts=E, **{"switch.top_k": 2})
  guard = health.CollapseGuard(settings, start_step=10)
  found = guard.observe(20, window)
  assert [c.dead for c in found if c.dead] == [True]
  assert "the two busiest of its 4 experts take 100.0% of the tokens" in found[0].message()

"""The routing analysis on a top-k layer: every choice of the hand loop in the routing records."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from stablemoe_jax.core.settings import MoESettings, typed
from stablemoe_jax.models.moe import make_moe_layer
from tests.models.topk_reference import D, FF, SUB, VOCAB, hand_topk_layer, init_layer, moe_config


class _OneLayerModel(nn.Module):
  """A model of one MoE layer named moe_0, called as the routing analysis calls a model."""
  cfg: ml_collections.ConfigDict

  @nn.compact
  def __call__(self, x, ids, in_stage1, deterministic=True):
    return make_moe_layer(typed(MoESettings, self.cfg), VOCAB, SUB, FF, name="moe_0")(x, ids, in_stage1, deterministic)


@pytest.mark.parametrize("top_k", [2, 1])
def test_the_routing_analysis_reads_every_choice_of_the_hand_loop(top_k):
  """What the routing records and the split analysis read (analysis/routes.py): every one of a token's k choices
  and gates, as the hand loop ranks them; the first-choice reading is their first column."""
  from stablemoe_jax.analysis.routes import make_sample_router, make_split_router
  cfg = moe_config(top_k=top_k)
  _, params, x, ids = init_layer(cfg)
  _, choices, gates, _ = hand_topk_layer(params, np.asarray(x, np.float64).reshape(24, D), top_k, 24)
  model, params = _OneLayerModel(cfg), {"moe_0": params}
  train, inference = jax.jit(make_sample_router(model, 0, choices=True))(params, (x, ids), jnp.array(False))
  first, _ = jax.jit(make_sample_router(model, 0))(params, (x, ids), jnp.array(False))
  for routed in (train, inference):
    assert routed["moe_0"].shape == (24, top_k)
    np.testing.assert_array_equal(routed["moe_0"], choices)
  np.testing.assert_array_equal(first["moe_0"], choices[:, 0])
  experts, split_gates = jax.jit(make_split_router(model))(params, (x, ids))["moe_0"]
  np.testing.assert_array_equal(experts, choices)
  assert split_gates.shape == (24, top_k)
  if top_k > 1:  # the hand loop's top-1 gate is renormalised to 1; Switch's top-1 gate is the probability itself
    np.testing.assert_allclose(split_gates, gates, rtol=1e-5)

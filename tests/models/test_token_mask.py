"""Padding in a MoE layer (translation batches): it takes no expert capacity and counts in no loss or metric.

References are the same functions on the real tokens alone (padding removed), and a per-token loop.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from tests.conftest import jit_init
from tests.mt_fixtures import tiny_model_config
from tests.models.test_moe import D, E, FF, SUB, VOCAB, moe_config, per_token_reference, randomized

from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.models.moe import make_moe_layer
from stablemoe_jax.models.routing import STATS, expert_load, layer_stats, routing_health, stablemoe_balance_loss
from stablemoe_jax.models.seq2seq import PAD_ID, TransformerSeq2Seq
from stablemoe_jax.models.switch_router import switch_balance_loss
from stablemoe_jax.core.settings import MoESettings, ModelSettings, typed

RNG = np.random.default_rng(0)
SCORES = jnp.asarray(RNG.normal(size=(10, 4)), jnp.float32)
ASSIGNMENT = jnp.asarray([0, 0, 1, 3, 0, 2, 2, 1, 0, 0], jnp.int32)
REAL = np.array([1, 1, 0, 1, 1, 0, 1, 1, 0, 0], bool)


@pytest.mark.parametrize("scope", ["assigned", "all"])
def test_balance_losses_with_padding_equal_the_losses_of_the_real_tokens_alone(scope):
  weights = jnp.asarray(REAL, jnp.float32)
  masked = stablemoe_balance_loss(SCORES, ASSIGNMENT, 0.3, scope, weights)
  alone = stablemoe_balance_loss(SCORES[REAL], ASSIGNMENT[REAL], 0.3, scope)
  np.testing.assert_allclose(masked, alone, rtol=1e-6)
  grad = jax.grad(lambda s: stablemoe_balance_loss(s, ASSIGNMENT, 0.3, scope, weights))(SCORES)
  assert np.all(np.asarray(grad)[~REAL] == 0)  # padding's scores get no gradient
  probs = jax.nn.softmax(SCORES, axis=-1)
  np.testing.assert_allclose(switch_balance_loss(probs, ASSIGNMENT, weights),
                             switch_balance_loss(probs[REAL], ASSIGNMENT[REAL]), rtol=1e-6)


def test_health_and_load_with_padding_equal_those_of_the_real_tokens_alone():
  gates = jnp.asarray(RNG.uniform(size=10), jnp.float32).at[2].set(0.0)  # a padding token with a "dead" gate
  weights = jnp.asarray(REAL, jnp.float32)
  masked = jax.device_get(routing_health(ASSIGNMENT, gates, 4, weights))
  alone = jax.device_get(routing_health(ASSIGNMENT[REAL], gates[REAL], 4))
  assert masked.keys() == alone.keys()
  for name in masked:
    np.testing.assert_allclose(masked[name], alone[name], rtol=1e-6, err_msg=name)
  np.testing.assert_allclose(expert_load(ASSIGNMENT, 4, weights), expert_load(ASSIGNMENT[REAL], 4), rtol=1e-6)


@pytest.mark.parametrize("shuffle", [False, True])
def test_padding_takes_no_slot_and_real_tokens_keep_theirs(shuffle):
  experts, capacity = 3, 2
  index = jnp.asarray([[0, 0, 0, 1, 0, 0, 2, 1]], jnp.int32)
  valid = jnp.asarray([[False, False, False, True, True, True, True, False]])
  rng = jax.random.key(3) if shuffle else None
  slots = np.asarray(capacity_lib.group_slots(index, experts, capacity, rng, valid))[0]
  sentinel = experts * capacity
  assert np.all(slots[~np.asarray(valid[0])] == sentinel)
  real = np.asarray(valid[0])
  # Without the mask the three leading padding tokens would fill expert 0: here both real ones are kept.
  assert np.all(slots[real] < sentinel)
  assert len(set(slots[real].tolist())) == real.sum()  # distinct slots
  np.testing.assert_array_equal(slots[real] // capacity, np.asarray(index[0])[real])
  unmasked = np.asarray(capacity_lib.group_slots(index, experts, capacity))[0]
  assert np.sum(unmasked[real] == sentinel) == 2  # the defect this fixes


def test_moe_layer_with_padding_against_the_per_token_loop_of_its_real_tokens():
  # Capacity 2 per expert over 12 tokens, padding first: without the mask padding would crowd out real tokens.
  cfg = moe_config(capacity_factor=0.66)
  layer = make_moe_layer(typed(MoESettings, cfg), VOCAB, SUB, FF)
  x = jax.random.normal(jax.random.key(0), (2, 6, D))
  ids = jax.random.randint(jax.random.key(1), (2, 6), 0, VOCAB)
  params = randomized(nn.unbox(jit_init(layer, 2, x, ids, jnp.array(True))["params"]))
  mask = jnp.asarray([[False, False, False, True, True, True], [False, True, True, True, True, True]])
  stage1 = jnp.array(True)
  out, sown = layer.apply({"params": params}, x, ids, stage1, False, token_mask=mask, mutable=[STATS])
  real = np.asarray(mask).reshape(-1)
  flat_x, flat_ids = np.asarray(x).reshape(-1, D), np.asarray(ids).reshape(-1)
  capacity = capacity_lib.expert_capacity(12, E, 0.66)
  assert capacity == capacity_lib.expert_capacity(int(mask.sum()), E, 0.66) == 2  # the same with padding removed
  want = per_token_reference(params, flat_x[real], flat_ids[real], True, capacity)
  got = np.asarray(out).reshape(-1, D)
  np.testing.assert_allclose(got[real], want, rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(got[~real], flat_x[~real])  # padding passes unchanged
  # The layer's losses and metrics are those of the real tokens alone.
  alone_out, alone = layer.apply({"params": params}, jnp.asarray(flat_x[real])[None], jnp.asarray(flat_ids[real])[None],
                                 stage1, False, mutable=[STATS])
  got_leaves, want_leaves = (jax.tree_util.tree_leaves_with_path(tree) for tree in (sown, alone))
  assert [path for path, _ in got_leaves] == [path for path, _ in want_leaves]
  assert len(got_leaves) >= 10  # load, drops, health, balance and distillation losses, ...
  for (path, value), (_, want_value) in zip(got_leaves, want_leaves):
    np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))
  dropped = np.mean(got[real] == flat_x[real], axis=-1) == 1.0
  np.testing.assert_allclose(layer_stats(sown)[""].dropped_fraction, dropped.mean(), atol=1e-6)


@pytest.mark.slow  # ~21 s on 2 cores (compiles the encoder-decoder twice)
def test_translation_moe_metrics_do_not_change_with_the_amount_of_padding():
  config = tiny_model_config()
  model = TransformerSeq2Seq(typed(ModelSettings, config.model))
  source = jnp.asarray([[4, 9, 10, 11, 3], [5, 12, 13, 3, PAD_ID]], jnp.int32)
  target = jnp.asarray([[2, 20, 21, 22], [2, 30, PAD_ID, PAD_ID]], jnp.int32)
  params = jit_init(model, 0, source, target, jnp.array(True))["params"]

  def metrics(extra):
    padded_source = jnp.pad(source, ((0, 0), (0, extra)), constant_values=PAD_ID)
    padded_target = jnp.pad(target, ((0, 0), (0, extra)), constant_values=PAD_ID)
    _, sown = model.apply({"params": params}, padded_source, padded_target, jnp.array(True), mutable=[STATS])
    return jax.device_get(sown)

  short, long = (jax.tree_util.tree_leaves_with_path(metrics(extra)) for extra in (0, 6))
  paths = [jax.tree_util.keystr(path) for path, _ in short]
  assert paths == [jax.tree_util.keystr(path) for path, _ in long]
  assert any("encoder_moe" in p and "load_balance" in p for p in paths)
  assert any("decoder_moe" in p and ".losses.balance" in p for p in paths)
  for path, (_, value), (_, want) in zip(paths, long, short):
    np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-7, err_msg=path)

"""Top-k routing (Switch top-k), top-k dispatch and shared experts against per-token loops worked out by hand:
choice slots, Switch top-2's gates and balance loss, the top-2 layer on every dispatcher, shared experts' sum."""
import math
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.conftest import jit_init

from stablemoe_jax.core.settings import MoESettings, typed
from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.models import routers
from stablemoe_jax.models.moe import make_moe_layer
from stablemoe_jax.models.routing import ROUTING, STATS, layer_stats
from stablemoe_jax.models.switch_router import SwitchSoftmax, switch_balance_loss
from tests.models.topk_reference import D, E, FF, SUB, VOCAB, hand_topk_layer, init_layer, moe_config, np_ffn_stack


# --- slots ---------------------------------------------------------------------------------------------------------

def hand_choice_slots(index, capacity, valid=None):
  """index [Tg, k] -> slots [Tg, k]: first choices in token order, then second choices, first come first served."""
  tokens, k = index.shape
  slots = np.full((tokens, k), E * capacity)
  load = np.zeros(E, int)
  for j in range(k):
    for t in range(tokens):
      if valid is not None and not valid[t]:
        continue
      e = index[t, j]
      if load[e] < capacity:
        slots[t, j] = e * capacity + load[e]
        load[e] += 1
  return slots


def test_choice_slots_fill_first_choices_before_second_ones_by_hand():
  # Four tokens, capacity 2, E = 4 (dropped: slot 8). First choices in token order: t0 -> 0 (slot 0), t1 -> 0
  # (slot 1), t2 -> 0 (full: dropped), t3 -> 1 (slot 2). Then the second choices: t0 -> 1 (slot 3), t1 -> 2
  # (slot 4), t2 -> 1 (full), t3 -> 0 (full).
  index = jnp.asarray([[[0, 1], [0, 2], [0, 1], [1, 0]]])
  slots = np.asarray(capacity_lib.choice_slots(index, E, 2))[0]
  np.testing.assert_array_equal(slots, [[0, 3], [1, 4], [8, 8], [2, 8]])
  np.testing.assert_array_equal(slots, hand_choice_slots(np.asarray(index[0]), 2))


@pytest.mark.parametrize("capacity", [1, 3, 6])
def test_choice_slots_against_the_hand_loop_with_padding_and_k1_equal_to_group_slots(capacity):
  rng = np.random.default_rng(0)
  index = np.stack([rng.permutation(E)[:3] for _ in range(2 * 12)]).reshape(2, 12, 3)
  valid = rng.random((2, 12)) > 0.25
  got = np.asarray(capacity_lib.choice_slots(jnp.asarray(index), E, capacity, valid=jnp.asarray(valid)))
  for g in range(2):
    np.testing.assert_array_equal(got[g], hand_choice_slots(index[g], capacity, valid[g]))
  key = jax.random.key(3)
  np.testing.assert_array_equal(  # k = 1 is group_slots, shuffle included
      np.asarray(capacity_lib.choice_slots(jnp.asarray(index[..., :1]), E, capacity, key))[..., 0],
      np.asarray(capacity_lib.group_slots(jnp.asarray(index[..., 0]), E, capacity, key)))


def test_shuffled_choice_slots_keep_the_first_choices_first():
  # Shuffled: the k = 1 permutation orders the tokens, and still no second choice takes a slot while a first
  # choice of the same expert is dropped.
  rng = np.random.default_rng(1)
  index = np.stack([rng.permutation(E)[:2] for _ in range(16)]).reshape(1, 16, 2)
  key = jax.random.key(5)
  got = np.asarray(capacity_lib.choice_slots(jnp.asarray(index), E, 3, key))[0]
  order = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0), 16))
  np.testing.assert_array_equal(got[order], hand_choice_slots(index[0][order], 3))


# --- the router ----------------------------------------------------------------------------------------------------

def test_switch_top2_gates_and_balance_loss_by_hand():
  scores = jnp.asarray([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 1.0], [1.0, 2.0, 0.5, 0.0]])
  policy = SwitchSoftmax(balance_weight=1.0, top_k=2)
  index, _ = policy.assign(scores, False)
  np.testing.assert_array_equal(index, [[0, 1], [2, 3], [1, 0]])
  probs = np.asarray(jax.nn.softmax(scores, axis=-1), np.float64)
  want = [[probs[0, 0], probs[0, 1]], [probs[1, 2], probs[1, 3]], [probs[2, 1], probs[2, 0]]]
  want = np.asarray(want) / np.sum(want, axis=1, keepdims=True)
  np.testing.assert_allclose(policy.gate(scores, index), want, rtol=1e-6)
  # f over the 6 choices: expert 0 twice, 1 twice, 2 once, 3 once.
  f = np.asarray([2, 2, 1, 1]) / 6
  np.testing.assert_allclose(policy.losses(scores, index)["balance"], 4 * np.sum(f * probs.mean(0)), rtol=1e-6)
  np.testing.assert_allclose(switch_balance_loss(jnp.full((6, 4), 0.25), jnp.asarray([[0, 1], [2, 3]] * 3)), 1.0)


# --- the layer -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("capacity_factor, num_groups, dispatcher", [
    (2.0, 1, "index"), (0.75, 1, "index"), (0.75, 3, "index"), (0.75, 3, "one_hot"), (0.75, 3, "grouped"),
    (0.0, 1, "grouped")])
def test_top2_layer_matches_the_hand_loop(capacity_factor, num_groups, dispatcher):
  cfg = moe_config(capacity_factor=capacity_factor, num_groups=num_groups, dispatcher=dispatcher)
  layer, params, x, ids = init_layer(cfg)
  got, sown = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False,
                          mutable=[STATS, ROUTING])
  group = 24 // num_groups
  capacity = capacity_lib.expert_capacity(group, E, capacity_factor, top_k=2)  # ceil(cf * 2 * Tg / E), <= Tg
  assert capacity == (group if capacity_factor in (0.0, 2.0) else math.ceil(0.75 * 2 * group / E))
  want, choices, gates, kept = hand_topk_layer(params, np.asarray(x, np.float64).reshape(24, D), 2, capacity,
                                               num_groups)
  assert capacity == group or not kept.all()  # below Tg slots some choices are dropped: capacity counts choices
  np.testing.assert_allclose(np.asarray(got).reshape(24, D), want, rtol=2e-4, atol=2e-4)
  stats, routing = layer_stats(sown)[""], sown[ROUTING]
  np.testing.assert_allclose(stats.dropped_fraction, 1 - kept.mean(), rtol=1e-6)
  np.testing.assert_allclose(stats.load, np.bincount(choices.reshape(-1), minlength=E) / 48, rtol=1e-6)
  np.testing.assert_allclose(stats.mean_gate, gates.max(-1).mean(), rtol=1e-5)  # each token's largest gate
  np.testing.assert_array_equal(routing["expert_index"][0], choices[:, 0])
  np.testing.assert_array_equal(routing["expert_choices"][0], choices)
  np.testing.assert_allclose(routing["gate_choices"][0], gates, rtol=1e-5)


@pytest.mark.parametrize("router, top_k", [("switch", 2), ("switch", 1), ("stablemoe", 1), ("hash", 1)])
def test_shared_experts_add_their_ffns_to_the_routed_output(router, top_k):
  # Two shared experts: the layer's output minus the same layer's output without them (same routed parameters)
  # is the sum of the two shared FFN stacks, by hand, for every token.
  cfg = moe_config(router=router, top_k=top_k, shared_experts=2)
  layer, params, x, ids = init_layer(cfg)
  assert params["shared_experts"]["w_in"].shape == (2, SUB, D, FF)
  routed_only = {k: v for k, v in params.items() if k != "shared_experts"}
  plain = make_moe_layer(typed(MoESettings, moe_config(router=router, top_k=top_k)), VOCAB, SUB, FF)
  with_shared = np.asarray(layer.apply({"params": params}, x, ids, jnp.array(True)), np.float64).reshape(24, D)
  without = np.asarray(plain.apply({"params": routed_only}, x, ids, jnp.array(True)), np.float64).reshape(24, D)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["shared_experts"])
  h = np.asarray(x, np.float64).reshape(24, D)
  want = np.stack([np_ffn_stack(p, 0, h[t]) + np_ffn_stack(p, 1, h[t]) for t in range(24)])
  np.testing.assert_allclose(with_shared - without, want, rtol=2e-4, atol=2e-4)
  if router == "switch" and top_k == 2:  # and the whole output against the hand loop
    full, *_ = hand_topk_layer(params, h, 2, capacity_lib.expert_capacity(24, E, 2.0, top_k=2), shared=2)
    np.testing.assert_allclose(with_shared, full, rtol=2e-4, atol=2e-4)


def test_shared_experts_leave_padding_unchanged_and_are_not_split_over_expert_devices():
  cfg = moe_config(shared_experts=1)
  layer, params, x, ids = init_layer(cfg)
  mask = jnp.ones((2, 12), bool).at[0, :3].set(False)
  out = layer.apply({"params": params}, x, ids, jnp.array(True), token_mask=mask)
  np.testing.assert_array_equal(np.asarray(out)[0, :3], np.asarray(x)[0, :3])
  boxed = jit_init(layer, 2, x, ids, jnp.array(True))["params"]
  assert boxed["shared_experts"]["w_in"].names[0] is None and boxed["experts"]["w_in"].names[0] == "experts"


def test_shared_experts_drop_out_in_training_only():
  # Dropout 0.5 inside every expert. The shared experts' part of the output (the layer's, less the same layer's with
  # their w_out and b_out at 0, the routed part and its dropout keys unchanged) is the hand sum without dropout in
  # evaluation, and in training (the same dropout key) a different one; with dropout 0, the hand sum in both modes.
  cfg = moe_config(shared_experts=1)
  _, params, x, ids = init_layer(cfg)
  silent = {**params, "shared_experts": {**params["shared_experts"],
                                         **{k: jnp.zeros_like(params["shared_experts"][k]) for k in ("w_out", "b_out")}}}
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["shared_experts"])
  h = np.asarray(x, np.float64).reshape(24, D)
  want = np.stack([np_ffn_stack(p, 0, h[t]) for t in range(24)])
  for dropout in (0.0, 0.5):
    layer = make_moe_layer(typed(MoESettings, cfg), VOCAB, SUB, FF, dropout=dropout)
    apply = jax.jit(lambda params, training, layer=layer: layer.apply(
        {"params": params}, x, ids, jnp.array(True), deterministic=not training,
        rngs={"dropout": jax.random.key(3)}), static_argnums=1)
    for training in (False, True):
      shared = (np.asarray(apply(params, training), np.float64) - np.asarray(apply(silent, training))).reshape(24, D)
      if dropout and training:
        assert np.abs(shared - want).max() > 0.1 and np.mean(shared == 0.0) < 0.5
      else:
        np.testing.assert_allclose(shared, want, rtol=2e-4, atol=2e-4)


def test_registry_top_k_and_gate_kind():
  cfg = moe_config(top_k=3)
  cfg, hashed = typed(MoESettings, cfg), typed(MoESettings, moe_config(router="hash"))
  assert routers.top_k(cfg) == 3 and routers.gate_kind(cfg) == "softmax"
  assert routers.top_k(hashed) == 1 and routers.gate_kind(hashed) == "fixed"
  assert routers.gate_kind(typed(MoESettings, moe_config(router="stablemoe"))) == "sigmoid"

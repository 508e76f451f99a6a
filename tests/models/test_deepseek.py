"""DeepSeek-V3's bias-balanced sigmoid router against hand computations: its choices and gates, the sequence-wise
balance loss, the bias update over a few steps (by hand and in the train step, where the optimizer never moves the
bias), the layer against a per-token loop, its gate range and a planted collapse, its config errors."""
import dataclasses
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from types import SimpleNamespace
from tests.conftest import jit_init

from configs import default
from stablemoe_jax.core.settings import DeepSeekSettings, ModelSettings, MoESettings, from_config, typed
from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.models import deepseek_router, routers
from stablemoe_jax.models.moe import make_moe_layer
from stablemoe_jax.models.routing import STATS, layer_stats, routing_health

D, FF, E, SUB, VOCAB = 8, 16, 4, 2, 11


def section(**changes):
  return ml_collections.ConfigDict({**dataclasses.asdict(DeepSeekSettings()), **changes})


def moe_config(capacity_factor=2.0, **changes):
  return ml_collections.ConfigDict(dict(
      router="deepseek", num_experts=E, capacity_factor=capacity_factor, eval_capacity_factor=capacity_factor,
      d_ff=FF, num_groups=1, shuffle_tokens=False, dispatcher="index", eval_dispatcher="index",
      deepseek={**dataclasses.asdict(DeepSeekSettings()), **changes}))


def np_sigmoid(x):
  return 1 / (1 + np.exp(-x))


def hand_route(centroids, bias, h, top_k, scale):
  """Per token: a = sigmoid(E h); the k experts with the largest a + b; gates a_chosen / sum(a_chosen) * scale."""
  choices, gates = [], []
  for t in range(h.shape[0]):
    a = np_sigmoid(centroids @ h[t])
    ranked = sorted(range(len(a)), key=lambda i: -(a[i] + bias[i]))[:top_k]
    choices.append(ranked)
    gates.append([scale * a[i] / sum(a[j] for j in ranked) for i in ranked])
  return np.array(choices), np.array(gates)


def test_choices_on_affinity_plus_bias_and_gates_without_it_by_hand():
  router = deepseek_router.DeepSeekRouter(num_experts=E, top_k=2, routed_scale=2.5)
  h = jax.random.normal(jax.random.key(0), (10, D))
  params = jit_init(router, 1, h, jnp.zeros((10,), jnp.int32), jnp.array(True))["params"]
  params = {**params, "centroids": 0.8 * jax.random.normal(jax.random.key(2), (E, D)),
            "expert_bias": jnp.asarray([0.0, 0.3, -0.4, 0.1])}
  routing = router.apply({"params": params}, h, jnp.zeros((10,), jnp.int32), jnp.array(True))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  want_index, want_gate = hand_route(p["centroids"], p["expert_bias"], np.asarray(h, np.float64), 2, 2.5)
  np.testing.assert_array_equal(routing.expert_index, want_index)
  np.testing.assert_allclose(routing.gate, want_gate, rtol=1e-5)
  np.testing.assert_allclose(np.sum(routing.gate, axis=-1), 2.5, rtol=1e-6)  # the scale, whatever the bias
  unbiased, _ = hand_route(p["centroids"], np.zeros(E), np.asarray(h, np.float64), 2, 2.5)
  assert not np.array_equal(unbiased, want_index)  # the bias changed some choice


def test_gate_metrics_read_each_tokens_largest_gate_when_the_bias_ranks_the_smaller_first():
  # A bias of +1 on expert 0 ranks it first for every token, whatever its affinity; its gate is then the smaller
  # of the two for the tokens whose other choice has the larger affinity, so only the largest gate stays in the
  # verdict's range [scale / k, scale].
  router = deepseek_router.DeepSeekRouter(num_experts=E, top_k=2, routed_scale=1.0)
  h = jax.random.normal(jax.random.key(0), (16, D))
  params = jit_init(router, 1, h, jnp.zeros((16,), jnp.int32), jnp.array(True))["params"]
  params = {**params, "centroids": jax.random.normal(jax.random.key(2), (E, D)),
            "expert_bias": jnp.asarray([1.0, 0.0, 0.0, 0.0])}
  routing = router.apply({"params": params}, h, jnp.zeros((16,), jnp.int32), jnp.array(True))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  choices, gates = hand_route(p["centroids"], p["expert_bias"], np.asarray(h, np.float64), 2, 1.0)
  assert (choices[:, 0] == 0).all() and (gates[:, 0] < 0.5).sum() >= 4  # the first choice's gate under 1 / k
  health = jax.device_get(routing_health(routing.expert_index, routing.gate, E))
  np.testing.assert_allclose(health["mean_gate"], gates.max(-1).mean(), rtol=1e-5)
  np.testing.assert_allclose(health["low_gate_fraction"], np.mean(gates.max(-1) < 0.01))
  assert 0.5 <= health["mean_gate"] <= 1.0


class _OneLayerModel(nn.Module):
  """``x [B, S, D] -> the deepseek MoE layer "moe_0" of x``: the train step's model interface, nothing else."""

  moe: MoESettings

  @nn.compact
  def __call__(self, x, in_stage1, deterministic=True):
    layer = make_moe_layer(self.moe, VOCAB, SUB, FF, name="moe_0")
    return layer(x, jnp.zeros(x.shape[:2], jnp.int32), in_stage1, deterministic=deterministic)


class _SquaredErrorTask:
  """loss = mean((layer output - target)^2): every gate and expert output reaches it."""

  def model_inputs(self, batch):
    return (batch["x"],)

  def model_keywords(self, batch):
    del batch
    return {}

  def train_loss(self, output, batch):
    return jnp.mean((output - batch["target"]) ** 2)


def _bias_step_config(rate=0.01):
  config = default.get_config()
  config.model.moe = moe_config(capacity_factor=2.0, balance_weight=0.1, bias_update_rate=rate)
  train = config.train
  train.learning_rate, train.warmup_steps, train.steps, train.stage1_steps, train.microbatches = 1e-2, 1, 10, 1, 1
  return config


def _batch(seed):
  x, target = jax.random.normal(jax.random.key(seed), (2, 2, 6, D))
  return {"x": x, "target": target}


def test_no_path_gives_the_bias_a_gradient():
  # The bias ranks the experts (it changes choices here) and reaches the loss only through top_k's integer
  # indices: the gradient of each part of the training loss (the output through gates and experts, the
  # sequence-wise balance loss) is exactly zero for it, and not for the centroids, whose affinities feed both.
  # Random parameters: at initialisation the experts add nothing (w_out 0), so no gate could have a gradient.
  config = _bias_step_config()
  model, batch = _OneLayerModel(typed(MoESettings, config.model.moe)), _batch(0)
  leaves, treedef = jax.tree.flatten(nn.unbox(jit_init(model, 1, batch["x"], jnp.array(True))["params"]))
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params = jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, a.shape) for k, a in zip(keys, leaves)])
  assert np.all(np.asarray(params["moe_0"]["router"]["expert_bias"]) != 0)

  def losses(params):
    out, sown = model.apply({"params": params}, batch["x"], jnp.array(True), deterministic=False, mutable=[STATS])
    return jnp.stack([_SquaredErrorTask().train_loss(out, batch), layer_stats(sown)["moe_0"].losses.balance])

  grads = jax.jit(jax.jacrev(losses))(params)["moe_0"]["router"]  # [2, ...]: the task loss's, the balance loss's
  for part in (0, 1):
    assert not np.any(np.asarray(grads["expert_bias"][part])) and np.any(np.asarray(grads["centroids"][part]))
  unbiased = jax.tree_util.tree_map_with_path(
      lambda path, a: jnp.zeros_like(a) if "expert_bias" in jax.tree_util.keystr(path) else a, params)
  route = jax.jit(lambda p: model.apply({"params": p}, batch["x"], jnp.array(True), mutable=["routing"])[1])
  assert not np.array_equal(*(np.asarray(jax.tree.leaves(route(p)["routing"]["moe_0"]["expert_choices"])[0])
                              for p in (params, unbiased)))  # the bias is live in the forward pass


def test_the_optimizer_leaves_the_bias_alone_while_the_hook_moves_it():
  # Three real train steps (Adam, clipping, the registry's hook; the first at lr 0, the warmup's start) of a
  # one-layer model: after each, the bias is exactly the previous one moved by the hook's rule from that step's
  # logged load. Adam turns any gradient the bias could get, however small, into a step of about the learning rate
  # (1e-2), and weight decay would shrink it.
  from stablemoe_jax.experiment.step import make_train_step
  from stablemoe_jax.train.optimizer import make_optimizer
  from stablemoe_jax.train.state import TrainState
  config = from_config(_bias_step_config())
  model, tx = _OneLayerModel(config.model.moe), make_optimizer(config.train)
  params = nn.unbox(jit_init(model, 1, _batch(0)["x"], jnp.array(True))["params"])
  state = TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=tx.init(params))
  step_fn = jax.jit(make_train_step(model, tx, config, _SquaredErrorTask()))
  bias = np.zeros(E, np.float32)
  for seed in (0, 3, 1):
    before = jax.device_get(state.params)
    state, metrics = step_fn(state, _batch(seed))
    load = np.asarray(metrics["moe/moe_0/load"])
    # No expert exactly at the mean load (6 of the 24 choices): there the float32 rounding of the loads and their
    # mean decides the sign, and the hook moves the bias by the rate either way (issue 75's report).
    assert np.all(np.abs(load * 24 - 6) > 0.5)
    bias = bias + np.float32(0.01) * np.sign(np.float32(load.mean()) - load).astype(np.float32)  # by hand
    after = jax.device_get(state.params)
    np.testing.assert_allclose(after["moe_0"]["router"]["expert_bias"], bias, rtol=0, atol=1e-7)
    moved = np.abs(before["moe_0"]["router"]["centroids"] - after["moe_0"]["router"]["centroids"]).max()
    assert moved > 1e-3 if seed else moved == 0  # Adam's steps of about the learning rate, from the second on
  assert np.any(bias != 0)
  moments = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state.opt_state))
             if "expert_bias" in jax.tree_util.keystr(path)]
  assert moments and not any(np.any(m) for m in moments)  # Adam's moments of the bias: zero (no gradient)


def test_gates_and_balance_loss_keep_a_finite_gradient_when_the_affinities_underflow():
  # Chosen logits near -60: a / sum(a) is finite there but its gradient is not (sum(a)^2 underflows), which made a
  # real run's update NaN under a finite loss. By hand: gates a_i / sum(a_j) = softmax of the logits' log-sigmoids,
  # which for logits far below 0 is softmax(logits) = (1, e^-1) / (1 + e^-1) for logits (-60, -61).
  router = deepseek_router.DeepSeekRouter(num_experts=2, top_k=2, routed_scale=1.0, balance_weight=0.1)
  h = jnp.ones((4, 2))
  ids = jnp.zeros((2, 2), jnp.int32)
  params = {"centroids": jnp.asarray([[-30.0, -30.0], [-30.5, -30.5]]), "expert_bias": jnp.zeros(2)}

  def loss(params):
    routing = router.apply({"params": params}, h, ids, jnp.array(True))
    return jnp.sum(routing.gate * jnp.asarray([1.0, 2.0])) + routing.losses.balance, routing

  (value, routing), grads = jax.value_and_grad(loss, has_aux=True)(params)
  e = np.exp(-1.0)
  np.testing.assert_allclose(routing.gate, np.tile([1 / (1 + e), e / (1 + e)], (4, 1)), rtol=1e-5)
  assert np.isfinite(value)
  # The loss is g_0 + 2 g_1 = 1 + g_1, g_1 = sigmoid(l_1 - l_0), l_i = c_i . h; the balance term is constant
  # (both experts chosen by every token: f = (1, 1), sum_i P_i = 1). So d/dc_1 = -d/dc_0 = 4 tokens x g_1 (1 - g_1) h.
  g1 = e / (1 + e)
  np.testing.assert_allclose(grads["centroids"], [[-4 * g1 * (1 - g1)] * 2, [4 * g1 * (1 - g1)] * 2], rtol=1e-4)


def test_sequence_balance_loss_by_hand():
  # Two sequences of 2 tokens, N = 2 experts, k = 1. f_i = N / (k S) * count_i, P_i = mean normalised affinity.
  affinity = jnp.asarray([[0.8, 0.2], [0.6, 0.6], [0.1, 0.9], [0.5, 0.5]])
  index = jnp.asarray([[0], [0], [1], [0]])
  # Sequence 1: both chose 0: f = (2, 0); P_0 = (0.8 + 0.5) / 2 = 0.65 -> 1.3.
  # Sequence 2: one each: f = (1, 1); P = ((0.1 + 0.5) / 2, (0.9 + 0.5) / 2) = (0.3, 0.7) -> 1.0.
  got = deepseek_router.sequence_balance_loss(jnp.log(affinity), index, 2)
  np.testing.assert_allclose(got, (1.3 + 1.0) / 2, rtol=1e-6)
  # Padding counts nowhere: sequence 1 with its second token padding is f = (2, 0), P_0 = 0.8 -> 1.6.
  padded = deepseek_router.sequence_balance_loss(jnp.log(affinity), index, 2, jnp.asarray([1.0, 0.0, 1.0, 1.0]))
  np.testing.assert_allclose(padded, (1.6 + 1.0) / 2, rtol=1e-6)


def test_bias_update_over_three_steps_by_hand():
  hook = deepseek_router.bias_update_hook(typed(ModelSettings, {"moe": {"deepseek": section(
      bias_update_rate=0.01)}}))
  params = {"moe_0": {"router": {"expert_bias": jnp.zeros(E), "centroids": jnp.ones((E, D))}},
            "encoder_moe_1": {"router": {"expert_bias": jnp.full((E,), 0.5)}}}
  loads = [[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.1, 0.4], [0.1, 0.5, 0.2, 0.2]]
  bias, other = np.zeros(E), np.full(E, 0.5)
  for load in loads:
    # The hook reads each layer's MoEStats.load only.
    stats = {"moe_0": SimpleNamespace(load=jnp.asarray(load)),
             "encoder_moe_1": SimpleNamespace(load=jnp.asarray(load[::-1]))}
    params = hook(params, stats)
    for b, l in ((bias, load), (other, load[::-1])):
      for i in range(E):  # by hand: up by 0.01 below the mean load (0.25), down above it, unchanged on it
        b[i] += 0.01 if l[i] < 0.25 else (-0.01 if l[i] > 0.25 else 0.0)
    np.testing.assert_allclose(params["moe_0"]["router"]["expert_bias"], bias, atol=1e-7)
    np.testing.assert_allclose(params["encoder_moe_1"]["router"]["expert_bias"], other, atol=1e-7)
  np.testing.assert_allclose(bias, [0.0, -0.02, 0.03, 0.01], atol=1e-7)  # -, 0, +; -, 0, -; +, +, +; +, -, +
  np.testing.assert_array_equal(params["moe_0"]["router"]["centroids"], 1.0)  # nothing else moves
  assert deepseek_router.bias_update_hook(typed(ModelSettings,
      {"moe": {"deepseek": section(bias_update_rate=0.0)}})) is None


def test_layer_against_the_per_token_loop_with_capacity():
  cfg = moe_config(capacity_factor=0.75, routed_scale=1.5)
  layer = make_moe_layer(typed(MoESettings, cfg), VOCAB, SUB, FF)
  x = jax.random.normal(jax.random.key(0), (2, 12, D))
  ids = jnp.zeros((2, 12), jnp.int32)
  params = nn.unbox(jit_init(layer, 2, x, ids, jnp.array(True))["params"])
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params = jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, a.shape) for k, a in zip(keys, leaves)])
  got = np.asarray(layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False)).reshape(24, D)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  h = np.asarray(x, np.float64).reshape(24, D)
  choices, gates = hand_route(p["router"]["centroids"], p["router"]["expert_bias"], h, 2, 1.5)
  capacity = capacity_lib.expert_capacity(24, E, 0.75, top_k=2)
  assert capacity == 9  # ceil(0.75 * 2 * 24 / 4): some of the 48 choices are dropped
  load, want = np.zeros(E, int), h.copy()
  for j in range(2):  # every first choice, then every second choice
    for t in range(24):
      e = choices[t, j]
      if load[e] < capacity:
        load[e] += 1
        y = h[t].copy()
        for s in range(SUB):
          ex = p["experts"]
          z = (y - y.mean()) / np.sqrt(y.var() + 1e-5) * ex["ln_scale"][e, s] + ex["ln_bias"][e, s]
          y = y + np.maximum(z @ ex["w_in"][e, s] + ex["b_in"][e, s], 0) @ ex["w_out"][e, s] + ex["b_out"][e, s]
        want[t] += gates[t, j] * (y - h[t])
  assert load.sum() < 48  # some choices were dropped
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


# --- health ----------------------------------------------------------------------------------------------------------

def _guard_settings(**changes):
  from stablemoe_jax.train import health
  config = default.get_config()
  config.train.warmup_steps, config.health.patience = 10, 1
  config.model.moe.router = "deepseek"
  for key, value in changes.items():
    config.model.moe.deepseek[key] = value
  return health.GuardSettings.from_settings(from_config(config))


def test_gate_range_and_planted_collapses_are_caught():
  from stablemoe_jax.train import health
  settings = _guard_settings(routed_scale=2.0)
  assert (settings.gate, settings.top_k, settings.gate_scale) == ("softmax", 2, 2.0)
  assert health.gate_range(settings, {}) == (1.0, 2.0)  # the larger of two normalised affinities, x 2
  guard = health.CollapseGuard(settings, start_step=10)
  found = guard.observe(20, {"moe/moe_0/mean_gate": 1.001, "moe/moe_0/load_balance": 0.9,
                             "moe/moe_0/load": [0.125] * 8})
  assert [c.dead for c in found] == [False] and "[1.000, 2.000]" in found[0].message()
  guard = health.CollapseGuard(_guard_settings(), start_step=10)  # every choice on two experts: degenerate
  found = guard.observe(20, {"moe/moe_0/mean_gate": 0.7, "moe/moe_0/load": [0.5, 0.49] + [0.01 / 6] * 6})
  assert [c.dead for c in found] == [True] and "deepseek.bias_update_rate" in found[0].message()


# --- config ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, message", [
    ("top_k", 0, "model.moe.deepseek.top_k=0 must be an integer in [1, model.moe.num_experts=8]"),
    ("top_k", 9, "model.moe.deepseek.top_k=9 must be an integer in [1, "),
    ("bias_update_rate", -0.1, "model.moe.deepseek.bias_update_rate=-0.1 must be >= 0"),
    ("balance_weight", -1.0, "model.moe.deepseek.balance_weight=-1.0 must be >= 0"),
    ("routed_scale", 0.0, "model.moe.deepseek.routed_scale=0.0 must be > 0"),
])
def test_bad_values_are_one_config_error(key, value, message):
  from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
  config = default.get_config()
  config.model.moe.router = "deepseek"
  config.model.moe.deepseek[key] = value
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("key, value", [("top_k", 1), ("top_k", 8), ("bias_update_rate", 0.0), ("balance_weight", 0.0),
                                        ("centroid_gain", 0.0), ("routed_scale", 1e-6)])
def test_values_at_the_edge_of_their_range_pass(key, value):
  from stablemoe_jax.experiment.config_validation import validate_config
  config = default.get_config()
  config.model.moe.router = "deepseek"
  config.model.moe.deepseek[key] = value
  validate_config(config)


@pytest.mark.parametrize("key, value, message", [
    ("centroid_gain", -0.1, "model.moe.deepseek.centroid_gain=-0.1 must be >= 0 (orthogonal-init gain"),
    ("top_k", True, "model.moe.deepseek.top_k=True must be an integer (the default 2)"),
    ("top_k", 2.0, "model.moe.deepseek.top_k=2.0 must be an integer (the default 2)"),
    ("routed_scale", -1.0, "model.moe.deepseek.routed_scale=-1.0 must be > 0"),
])
def test_a_negative_gain_or_a_top_k_of_another_type_is_one_config_error(key, value, message):
  from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
  tree = default.get_config().to_dict()  # a ConfigDict keeps a key's type once set: the value goes in as a dict's
  tree["model"]["moe"]["router"] = "deepseek"
  tree["model"]["moe"]["deepseek"][key] = value
  with pytest.raises(ConfigError) as error:
    validate_config(ml_collections.ConfigDict(tree))
  assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)


def test_a_deepseek_setting_under_another_router_is_an_error():
  from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
  config = default.get_config()
  config.model.moe.deepseek.bias_update_rate = 0.01
  with pytest.raises(ConfigError, match="is a setting of router 'deepseek'"):
    validate_config(config)
  assert routers.top_k(typed(MoESettings, config.model.moe)) == 1


# --- in training -----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_train_step_moves_the_bias_by_the_steps_load_and_the_optimizer_never_does(tiny_config, prepared_ptb,
                                                                                    tmp_path):
  from tests.conftest import share_prepared_ptb
  from stablemoe_jax.experiment import loop
  from stablemoe_jax.experiment.step import make_train_step
  share_prepared_ptb(prepared_ptb, tmp_path)
  tiny_config.model.moe.router, tiny_config.model.moe.deepseek.bias_update_rate = "deepseek", 0.01
  tiny_config.model.moe.shared_experts = 1
  exp = loop.Experiment(tiny_config, tmp_path)
  state = exp.init_state()
  step_fn = jax.jit(make_train_step(exp.model, exp.tx, exp.settings, exp.task))
  batches = exp.data.train_iterator(4, 16, seed=0)
  bias = np.zeros(4, np.float32)
  initial = jax.device_get(state.params)
  for _ in range(4):
    state, metrics = step_fn(state, next(batches))
    load = np.asarray(metrics["moe/moe_0/load"])
    bias = bias + np.float32(0.01) * np.sign(np.float32(load.mean()) - load).astype(np.float32)  # by hand
    after = jax.device_get(state.params)
    np.testing.assert_allclose(after["moe_0"]["router"]["expert_bias"], bias, atol=1e-7)
    assert np.isfinite(float(metrics["loss"]))
  assert np.any(bias != 0)  # the centroids learn (step 0's lr is 0 in the warmup), the bias only by the hook
  assert not np.array_equal(initial["moe_0"]["router"]["centroids"], after["moe_0"]["router"]["centroids"])
  moments = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state.opt_state))
             if "expert_bias" in jax.tree_util.keystr(path)]
  assert moments and not any(np.any(m) for m in moments)  # Adam's moments of the bias: zero (no gradient)


@pytest.mark.slow
def test_deepseek_trains_end_to_end_and_resumes_exactly(tiny_config, prepared_ptb, tmp_path):
  # 8 steps with a checkpoint at 4; the same run with its step-8 checkpoint removed resumes from step 4 (the bias
  # restored with the parameters) and ends bit for bit where the whole run did.
  import shutil
  from tests.conftest import share_prepared_ptb
  from stablemoe_jax.experiment import loop
  share_prepared_ptb(prepared_ptb, tmp_path / "a")
  tiny_config.model.moe.router, tiny_config.model.moe.deepseek.bias_update_rate = "deepseek", 0.01
  tiny_config.train.steps, tiny_config.train.stage1_steps, tiny_config.train.eval_every = 8, 2, 100
  whole = loop.train_and_evaluate(tiny_config, tmp_path / "a")
  shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True)
  shutil.rmtree(tmp_path / "b" / "checkpoints" / "8")
  (tmp_path / "b" / "summary.json").unlink()
  resumed = loop.train_and_evaluate(tiny_config, tmp_path / "b")
  assert np.isfinite(whole.test["perplexity"])
  assert resumed.test["perplexity"] == whole.test["perplexity"]

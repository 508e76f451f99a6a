"""The StableMoE stabilizer candidates (docs/tuning.md): each against an independent numpy reference, each off by
default (the routing and the optimizer exactly as without it), each bad value one clear ConfigError."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import default
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.models import cosine_routing, routers, stablemoe_router
from stablemoe_jax.models.experts import FFNExperts
from stablemoe_jax.core.settings import (DistilledRouterSettings, MoESettings, StableMoESettings, TrainSettings,
                                         absent_value, typed)
from stablemoe_jax.models.learned_router import LearnedRouter
from stablemoe_jax.models.moe import make_moe_layer
from stablemoe_jax.models.stablemoe_router import GreedySigmoid
from stablemoe_jax.train import optimizer

from tests.integration.test_train import _numpy_adam_updates  # float64 numpy Adam, bias-corrected

D, FF, E, SUB, VOCAB = 8, 16, 4, 2, 11


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _apply(router, params, h, ids=None, stage1=True):
  ids = jnp.zeros(h.shape[0], jnp.int32) if ids is None else ids
  return router.apply({"params": params}, h, ids, jnp.array(stage1), False)


# --- the expert bias init ----------------------------------------------------------------------------------------

@pytest.mark.slow  # 21 s on 2 cores (-n 2)
def test_torch_bias_init_bounds_and_layer_output_hand_computed():
  params = FFNExperts(E, SUB, FF, bias_init="torch").init(jax.random.key(0), D)["params"]
  p = jax.tree.map(np.asarray, nn.unbox(params))
  for name, fan_in in (("b_in", D), ("b_out", FF)):
    bound = 1 / np.sqrt(fan_in)  # PyTorch nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.all(np.abs(p[name]) <= bound) and np.abs(p[name]).max() > 0.8 * bound, name
    assert len(np.unique(p[name])) == p[name].size  # every expert and sublayer its own draw
  assert not p["w_out"].any()  # only the output weight is zeroed, as in the authors' MoESublayer
  zeros = jax.tree.map(np.asarray, nn.unbox(FFNExperts(E, SUB, FF).init(jax.random.key(0), D)["params"]))
  assert not zeros["b_in"].any() and not zeros["b_out"].any()  # the default: every expert adds exactly 0
  np.testing.assert_array_equal(zeros["w_in"], p["w_in"])  # the weights' draws are unchanged

  # With w_out = 0 each sublayer adds its b_out, so the layer gives h + sigmoid(s) * sum_s b_out[e, s].
  cfg = ml_collections.ConfigDict(dict(
      router="stablemoe", num_experts=E, capacity_factor=4.0, eval_capacity_factor=0.0, d_ff=FF, num_groups=1,
      shuffle_tokens=False, dispatcher="index", expert_bias_init="torch",
      stablemoe=dict(balance_alpha=0.3, centroid_gain=0.1), distilled_router={**dataclasses.asdict(DistilledRouterSettings()), "dim": 5}))
  layer = make_moe_layer(typed(MoESettings, cfg), VOCAB, SUB, FF)
  x = jax.random.normal(jax.random.key(3), (2, 6, D))
  ids = jnp.zeros((2, 6), jnp.int32)
  variables = nn.unbox(layer.init(jax.random.key(2), x, ids, jnp.array(True)))
  out = np.asarray(layer.apply(variables, x, ids, jnp.array(True), True), np.float64).reshape(-1, D)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  h = np.asarray(x, np.float64).reshape(-1, D)
  scores = h @ params["router"]["centroids"].T
  e = scores.argmax(-1)
  gate = _sigmoid(scores[np.arange(len(e)), e])
  want = h + gate[:, None] * params["experts"]["b_out"].sum(1)[e]
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


# --- the z-loss --------------------------------------------------------------------------------------------------

def test_stablemoe_z_loss_hand_computed_and_off_by_default():
  rng = np.random.default_rng(0)
  scores = rng.normal(0, 3, (10, 4)).astype(np.float32)
  weights = np.array([1] * 7 + [0] * 3, np.float32)
  assignment = jnp.asarray(scores.argmax(-1), jnp.int32)
  lse = np.log(np.exp(scores.astype(np.float64)).sum(-1))
  losses = GreedySigmoid(0.3, "all", z_loss_weight=0.01).losses(jnp.asarray(scores), assignment, jnp.asarray(weights))
  assert float(losses["z_loss"]) == pytest.approx(0.01 * np.mean(lse[:7] ** 2), rel=1e-5)  # padding counts nowhere
  default_losses = GreedySigmoid(0.3, "all").losses(jnp.asarray(scores), assignment, jnp.asarray(weights))
  assert set(default_losses) == {"balance"}
  assert float(default_losses["balance"]) == float(losses["balance"])


# --- cosine routing with a learned temperature ---------------------------------------------------------------------

@pytest.mark.parametrize("cosine_dim", [0, 3])
def test_cosine_routing_scores_gate_and_assignment_against_numpy(cosine_dim):
  h = jax.random.normal(jax.random.key(0), (12, D)) * 5 + 2  # a shared direction, as in the residual stream
  router = LearnedRouter(num_experts=E, policy=GreedySigmoid(0.3, "all"), affinity="cosine", cosine_dim=cosine_dim,
                         cosine_temperature=0.25)
  params = router.init(jax.random.key(1), h, jnp.zeros(12, jnp.int32), jnp.array(True))["params"]
  assert float(params["logit_scale"]) == pytest.approx(np.log(4.0))  # log(1 / tau), tau = 0.25
  assert params["centroids"].shape == (E, cosine_dim or D)
  routing = _apply(router, params, h)
  x = np.asarray(h, np.float64)
  if cosine_dim:
    x = x @ np.asarray(params["cosine_projection"]["kernel"], np.float64)
  c = np.asarray(params["centroids"], np.float64)
  cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (c / np.linalg.norm(c, axis=1, keepdims=True)).T
  scores = cos * 4.0
  np.testing.assert_array_equal(routing.expert_index[:, 0], scores.argmax(-1))
  np.testing.assert_allclose(routing.gate[:, 0], _sigmoid(scores.max(-1)), rtol=1e-5)
  assert float(routing.stats.router_temperature) == pytest.approx(0.25)
  # The balance loss acts on these scores: the learned temperature gets a gradient.
  grads = jax.grad(lambda p: _apply(router, p, h).losses.balance)(params)
  assert float(grads["logit_scale"]) != 0.0
  # 1 / tau is clipped at cosine_routing.MAX_LOGIT_SCALE.
  clipped = _apply(router, {**params, "logit_scale": jnp.array(10.0)}, h)
  np.testing.assert_allclose(clipped.gate[:, 0], _sigmoid(cos.max(-1) * cosine_routing.MAX_LOGIT_SCALE), rtol=1e-4)


def test_dot_product_stablemoe_router_is_the_router_before_the_new_keys_bit_for_bit():
  """The CPU default's section with the new keys at the registry's defaults (the paper's dot-product routing, no
  z-loss) builds the same router, parameters and outputs as a section without the new keys (the code before them)."""
  moe = default.get_config().model.moe
  for key in ("z_loss_weight", "affinity", "cosine_dim", "cosine_temperature"):
    moe.stablemoe[key] = absent_value(StableMoESettings, key)
  old = ml_collections.ConfigDict(moe.to_dict())
  for key in ("z_loss_weight", "affinity", "cosine_dim", "cosine_temperature"):
    del old.stablemoe[key]
  del old["expert_bias_init"]
  h = jax.random.normal(jax.random.key(0), (32, 16)) * 3
  ids = jax.random.randint(jax.random.key(1), (32,), 0, 50)
  results = []
  for section in (moe, old):
    router = routers.make_router(typed(MoESettings, section), vocab_size=50)
    params = router.init(jax.random.key(2), h, ids, jnp.array(True))["params"]
    results.append((params, _apply(router, params, h, ids)))
  (p_new, r_new), (p_old, r_old) = results
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), p_new, p_old))
  assert set(p_new) == {"centroids", "distilled_router"}
  np.testing.assert_array_equal(r_new.gate[:, 0], r_old.gate[:, 0])
  np.testing.assert_array_equal(r_new.expert_index[:, 0], r_old.expert_index[:, 0])
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), r_new, r_old))  # losses, stats too
  assert r_new.losses.z_loss is None and r_new.stats.router_temperature is None


# --- the routers' own optimizer settings -------------------------------------------------------------------------

def _train_config(**overrides):
  train = ml_collections.ConfigDict(dict(learning_rate=1e-2, warmup_steps=4, steps=20, stage1_steps=10, adam_b1=0.9,
                                         adam_b2=0.98, adam_eps=1e-8, clip_norm=1e6))
  for key, value in overrides.items():
    train[key] = value
  return train


def test_router_lr_scale_and_warmup_against_numpy_adam():
  params = {"moe_1": {"router": {"centroids": jnp.zeros((2, 3)), "distilled_router": {"w": jnp.zeros(2)}},
                      "experts": {"w": jnp.zeros((2, 3))}}}
  train = _train_config(router_lr_scale=0.5, router_warmup_steps=6)
  labels = optimizer.param_labels(params, separate_router=True)
  assert labels["moe_1"]["router"]["centroids"] == optimizer.ROUTER
  assert labels["moe_1"]["router"]["distilled_router"]["w"] == optimizer.FROZEN_AFTER_STAGE1
  assert labels["moe_1"]["experts"]["w"] == optimizer.TRAINED
  tx = optimizer.make_optimizer(typed(TrainSettings, train))
  state = tx.init(params)
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(9)]
  got_router, got_expert = [], []
  for g in grads:
    tree = {"moe_1": {"router": {"centroids": jnp.asarray(g), "distilled_router": {"w": jnp.ones(2)}},
                      "experts": {"w": jnp.asarray(g)}}}
    updates, state = tx.update(tree, state, params)
    got_router.append(np.asarray(updates["moe_1"]["router"]["centroids"]))
    got_expert.append(np.asarray(updates["moe_1"]["experts"]["w"]))
  g64 = [g.astype(np.float64) for g in grads]
  # optax counts from 0: the update of step k (1-based) uses the schedule at count k - 1.
  shared = [1e-2 * min(1.0, c / 4) if c < 4 else 1e-2 * (1 - (c - 4) / 16) for c in range(9)]
  router_lrs = [lr * 0.5 * min(1.0, c / 6) for c, lr in enumerate(shared)]
  for got, lrs in ((got_expert, shared), (got_router, router_lrs)):
    want = _numpy_adam_updates(g64, lrs, 0.9, 0.98, 1e-8)
    np.testing.assert_allclose(np.stack(got), np.stack(want), rtol=1e-4, atol=1e-9)


def test_router_optimizer_settings_off_by_default_leave_the_optimizer_as_it_was():
  train = default.get_config().train
  assert not optimizer.separate_router_optimizer(typed(TrainSettings, train))
  params = {"moe_1": {"router": {"centroids": jnp.ones((2, 3))}, "experts": {"w": jnp.ones(3)}}}
  assert optimizer.param_labels(params) == optimizer.param_labels(params, separate_router=False)
  assert optimizer.param_labels(params)["moe_1"]["router"]["centroids"] == optimizer.TRAINED
  state = optimizer.make_optimizer(typed(TrainSettings, train)).init(params)
  inner = state[1].inner_states
  assert set(inner) == {optimizer.TRAINED, optimizer.FROZEN_AFTER_STAGE1}  # the same state tree as before the keys


# --- validation --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, message", [
    ("model.moe.expert_bias_init", "xavier", "model.moe.expert_bias_init='xavier' is unknown"),
    ("train.router_lr_scale", 0.0, "train.router_lr_scale=0.0 must be > 0"),
    ("train.router_warmup_steps", -1, "train.router_warmup_steps=-1 must be >= 0"),
    ("model.moe.stablemoe.z_loss_weight", -0.1, "model.moe.stablemoe.z_loss_weight=-0.1 must be >= 0"),
    ("model.moe.stablemoe.affinity", "l2", "model.moe.stablemoe.affinity='l2' is unknown"),
    ("model.moe.stablemoe.affinity", "dot", "cosine_dim=16 applies only to cosine routing"),  # the default's 16
    ("model.moe.stablemoe.cosine_temperature", 0.0, "cosine_temperature=0.0 must be > 0"),
])
def test_each_stabilizer_key_rejects_a_bad_value_in_one_line(key, value, message):
  config = default.get_config()
  *parents, leaf = key.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as error:
    validate_config(config)
  assert "\n" not in str(error.value)


def test_cosine_settings_validate_with_cosine_and_optimizer_keys_with_any_router():
  config = default.get_config()
  config.model.moe.stablemoe.affinity, config.model.moe.stablemoe.cosine_dim = "cosine", 16
  config.train.router_lr_scale, config.train.router_warmup_steps = 0.1, 200
  validate_config(config)
  config.model.moe.router = "switch"  # the stablemoe keys are preset keys: other routers ignore them
  validate_config(config)

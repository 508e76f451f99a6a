"""X-MoE's routing (models/cosine_routing.py): its published expert embeddings (``cosine_expert_norm``: torchscale's
orthogonal gain-0.32 init, rows held at norm 1.5) and cosine routing for Switch, against numpy; the key off leaves
everything as it was; each bad value one clear ConfigError."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import default, tune_cpu
from stablemoe_jax.core.settings import MoESettings, ModelSettings, TrainSettings, typed
from stablemoe_jax.core.settings.routers import COSINE_KEYS
from stablemoe_jax.compare import methods
from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.experiment.step import make_train_step
from stablemoe_jax.models import cosine_routing, routers
from stablemoe_jax.models.learned_router import LearnedRouter
from stablemoe_jax.models.stablemoe_router import GreedySigmoid
from stablemoe_jax.train import optimizer
from stablemoe_jax.compare.comparison import Comparison

from tests.conftest import share_prepared_ptb
from tests.integration.test_train import _numpy_adam_updates  # float64 numpy Adam, bias-corrected

D, E, VOCAB = 8, 4, 11


def _apply(router, params, h, stage1=True):
  ids = jnp.zeros(h.shape[0], jnp.int32)
  return router.apply({"params": params}, h, ids, jnp.array(stage1), False)


def _np(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _row_norms(x):
  return np.linalg.norm(np.asarray(x, np.float64), axis=-1)


def _numpy_cosine(h, kernel, centroids, inv_tau):
  """cos(h P, E_i) / tau in float64: [T, N]."""
  x = np.asarray(h, np.float64) @ kernel
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  c = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)
  return x @ c.T * inv_tau


def _softmax(s):
  e = np.exp(s - s.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


# --- the init -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_experts, dim", [(4, 16), (8, 16), (32, 16)])
def test_xmoe_init_is_torch_orthogonal_gain_032_rescaled_to_norm_15(num_experts, dim):
  """torchscale: ``orthogonal_(wg [N, 16], gain=0.32)``, then its first forward's ``wg.mul_(1.5 / |wg_row|)``."""
  key = jax.random.key(3)
  raw = np.asarray(nn.initializers.orthogonal(0.32)(key, (num_experts, dim)), np.float64)
  if num_experts <= dim:  # orthogonal rows of norm 0.32 (gain x an orthonormal set)
    np.testing.assert_allclose(raw @ raw.T, 0.32**2 * np.eye(num_experts), atol=1e-6)
  else:  # more experts than dimensions: orthogonal columns of norm 0.32
    np.testing.assert_allclose(raw.T @ raw, 0.32**2 * np.eye(dim), atol=1e-6)
  got = np.asarray(cosine_routing.xmoe_expert_init(1.5)(key, (num_experts, dim)), np.float64)
  np.testing.assert_allclose(got, raw * (1.5 / np.linalg.norm(raw, axis=1, keepdims=True)), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(_row_norms(got), 1.5, rtol=1e-6)
  if num_experts <= dim:
    np.testing.assert_allclose(got @ got.T, 1.5**2 * np.eye(num_experts), atol=1e-5)
    np.testing.assert_allclose(got, raw * (1.5 / 0.32), rtol=1e-5, atol=1e-7)  # the hand value of the rescale


def test_the_router_uses_the_xmoe_init_only_with_the_key_on():
  h = jax.random.normal(jax.random.key(0), (12, D))
  ids, stage1 = jnp.zeros(12, jnp.int32), jnp.array(True)

  def init(**kwargs):
    router = LearnedRouter(num_experts=E, policy=GreedySigmoid(0.3, "all"), affinity="cosine", cosine_dim=6, **kwargs)
    return router.init(jax.random.key(1), h, ids, stage1)["params"]

  on, off = init(cosine_expert_norm=1.5), init()
  c = np.asarray(on["centroids"], np.float64)
  np.testing.assert_allclose(c @ c.T, 2.25 * np.eye(E), atol=1e-5)
  # Off: the router's own init, centroid_gain 0.1 (rows of norm 0.1); the other parameters are drawn the same.
  np.testing.assert_allclose(_row_norms(off["centroids"]), 0.1, rtol=1e-5)
  np.testing.assert_array_equal(on["cosine_projection"]["kernel"], off["cosine_projection"]["kernel"])
  np.testing.assert_array_equal(on["logit_scale"], off["logit_scale"])
  # With the key on the centroids' direction is the gain-0.32 draw (the same rng as the gain-0.1 one).
  np.testing.assert_allclose(c, np.asarray(off["centroids"], np.float64) * 15, rtol=1e-4, atol=1e-6)


# --- the rescale: one optimizer step against numpy -----------------------------------------------------------------

def _train_config(**overrides):
  train = ml_collections.ConfigDict(dict(learning_rate=1e-2, warmup_steps=0, steps=20, stage1_steps=10, adam_b1=0.9,
                                         adam_b2=0.98, adam_eps=1e-8, clip_norm=1e6))
  for key, value in overrides.items():
    train[key] = value
  return train


def _model_config(router="stablemoe", **section):
  moe = default.get_config().model.moe
  moe.router = router
  for key, value in section.items():
    moe[router][key] = value
  return ml_collections.ConfigDict({"moe": moe.to_dict(), "dense_match": "none"})


def test_expert_norm_hook_after_one_adam_step_against_numpy():
  """The stored centroids after an update are ``1.5 (c + u) / |c + u|`` row by row (u: numpy Adam's first update),
  every other leaf -- the distilled router's centroids too -- is ``p + u``, and the next forward's scores are the
  numpy cosine of those rows."""
  h = jax.random.normal(jax.random.key(0), (16, D)) * 3 + 1
  ids = jax.random.randint(jax.random.key(4), (16,), 0, VOCAB)
  model_config = _model_config(affinity="cosine", cosine_dim=6, cosine_expert_norm=1.5)
  router = routers.make_router(typed(MoESettings, model_config.moe), vocab_size=VOCAB)
  params = {"moe_0": {"router": router.init(jax.random.key(1), h, ids, jnp.array(True))["params"]}}
  np.testing.assert_allclose(_row_norms(params["moe_0"]["router"]["centroids"]), 1.5, rtol=1e-6)

  def loss(p):
    routing = router.apply({"params": p["moe_0"]["router"]}, h, ids, jnp.array(True), False)
    return jnp.sum(routing.gate[:, 0] * jnp.arange(16.0)) + sum(routing.losses.present().values())

  grads = jax.grad(loss)(params)
  # the real chain: clipping, multi_transform, the distilled freeze
  tx = optimizer.make_optimizer(typed(TrainSettings, _train_config()))
  updates, _ = tx.update(grads, tx.init(params), params)
  hook = cosine_routing.expert_norm_hook(typed(ModelSettings, model_config))
  new = hook(optax.apply_updates(params, updates))

  p0, g = _np(params), _np(grads)
  want = jax.tree.map(lambda p, gr: p + _numpy_adam_updates([gr], [1e-2], 0.9, 0.98, 1e-8)[0], p0, g)
  c = want["moe_0"]["router"]["centroids"]
  want["moe_0"]["router"]["centroids"] = 1.5 * c / np.linalg.norm(c, axis=1, keepdims=True)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), _np(new), want)
  got = new["moe_0"]["router"]
  np.testing.assert_allclose(_row_norms(got["centroids"]), 1.5, rtol=1e-6)
  assert _row_norms(got["distilled_router"]["centroids"]).max() < 0.5  # its gain-0.1 rows: not rescaled

  # The next forward: scores = cos(h P, E) / tau with the norm-1.5 rows (sigmoid gate of StableMoE).
  routing = router.apply({"params": got}, h, ids, jnp.array(True), False)
  scores = _numpy_cosine(h, want["moe_0"]["router"]["cosine_projection"]["kernel"],
                         want["moe_0"]["router"]["centroids"], np.exp(want["moe_0"]["router"]["logit_scale"]))
  np.testing.assert_array_equal(routing.expert_index[:, 0], scores.argmax(-1))
  np.testing.assert_allclose(routing.gate[:, 0], 1 / (1 + np.exp(-scores.max(-1))), rtol=1e-5)


def test_expert_norm_hook_is_off_unless_a_chosen_cosine_router_sets_a_norm():
  hook = lambda model_config: cosine_routing.expert_norm_hook(typed(ModelSettings, model_config))
  assert hook(default.get_config().model) is None  # the default: cosine, norm 0
  assert hook(_model_config(affinity="cosine", cosine_expert_norm=1.5)) is not None
  assert hook(_model_config("switch", affinity="cosine", cosine_expert_norm=1.5))
  # A preset on another router's section, the MoE layer off, or a dense baseline: nothing to hold.
  preset = _model_config("base")
  preset.moe.stablemoe.cosine_expert_norm = 1.5
  assert hook(preset) is None
  off = _model_config(affinity="cosine", cosine_expert_norm=1.5)
  off.moe.enabled = False
  assert hook(off) is None
  dense = _model_config(affinity="cosine", cosine_expert_norm=1.5)
  dense.dense_match = "deeper"
  assert hook(dense) is None


# --- Switch with cosine routing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("expert_norm", [0.0, 1.5])
def test_switch_cosine_scores_gate_assignment_and_loss_against_numpy(expert_norm):
  h = jax.random.normal(jax.random.key(0), (12, D)) * 5 + 2
  moe = _model_config("switch", affinity="cosine", cosine_dim=6, cosine_temperature=0.25,
                      cosine_expert_norm=expert_norm, balance_weight=0.5).moe
  router = routers.make_router(typed(MoESettings, moe), vocab_size=VOCAB)
  params = router.init(jax.random.key(1), h, jnp.zeros(12, jnp.int32), jnp.array(True))["params"]
  assert set(params) == {"centroids", "cosine_projection", "logit_scale"}
  assert float(params["logit_scale"]) == pytest.approx(np.log(4.0))
  norms = _row_norms(params["centroids"])
  # Off: Switch's own init (truncated normal, variance 0.1 / 6 a coordinate: rows of norm ~0.3).
  assert np.allclose(norms, 1.5, rtol=1e-6) if expert_norm else norms.max() < 1.0
  routing = _apply(router, params, h)
  p = _np(params)
  scores = _numpy_cosine(h, p["cosine_projection"]["kernel"], p["centroids"], 4.0)
  probs = _softmax(scores)
  expert = scores.argmax(-1)
  np.testing.assert_array_equal(routing.expert_index[:, 0], expert)
  np.testing.assert_allclose(routing.gate[:, 0], probs.max(-1), rtol=1e-5)
  num_experts = moe.num_experts  # the default's 8
  assert scores.shape == (12, num_experts)
  fraction = np.bincount(expert, minlength=num_experts) / len(expert)
  want = 0.5 * num_experts * np.sum(fraction * probs.mean(0))
  assert float(routing.losses.balance) == pytest.approx(want, rel=1e-5)
  assert float(routing.stats.router_temperature) == pytest.approx(0.25)
  grads = jax.grad(lambda q: _apply(router, q, h).losses.balance)(params)
  assert float(grads["logit_scale"]) != 0 and np.abs(np.asarray(grads["cosine_projection"]["kernel"])).max() > 0


def test_switch_with_the_new_keys_at_their_defaults_is_the_router_before_them_bit_for_bit():
  moe = default.get_config().model.moe
  moe.router = "switch"
  old = ml_collections.ConfigDict(moe.to_dict())
  for key in COSINE_KEYS:
    del old.switch[key]
  h = jax.random.normal(jax.random.key(0), (32, 16)) * 3
  ids = jnp.zeros(32, jnp.int32)
  results = []
  for section in (moe, old):
    router = routers.make_router(typed(MoESettings, section), vocab_size=50)
    params = router.init(jax.random.key(2), h, ids, jnp.array(True))["params"]
    results.append((params, _apply(router, params, h)))
  (p_new, r_new), (p_old, r_old) = results
  assert set(p_new) == {"centroids"}
  np.testing.assert_array_equal(p_new["centroids"], p_old["centroids"])
  np.testing.assert_array_equal(r_new.gate[:, 0], r_old.gate[:, 0])
  np.testing.assert_array_equal(r_new.expert_index[:, 0], r_old.expert_index[:, 0])
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), r_new, r_old))  # losses, stats too


# --- the methods and the validation -------------------------------------------------------------------------------

def test_the_cosine_methods_validate_and_set_their_keys():
  config = tune_cpu.get_config()  # the sweep's config
  config.compare.methods = "stablemoe_cosine,stablemoe_xmoe,switch_cosine,switch_xmoe,stablemoe_all"
  configs = methods.method_configs(Comparison.of(config))
  for name, router, norm in (("stablemoe_cosine", "stablemoe", 0.0), ("stablemoe_xmoe", "stablemoe", 1.5),
                             ("switch_cosine", "switch", 0.0), ("switch_xmoe", "switch", 1.5)):
    moe = configs[name].model.moe
    assert moe.router == router and moe[router].affinity == "cosine" and moe[router].cosine_dim == 16
    assert moe[router].cosine_temperature == 0.5 and moe[router].cosine_expert_norm == norm
  assert configs["stablemoe_all"].model.moe.stablemoe.affinity == "dot"
  assert configs["stablemoe_all"].model.moe.stablemoe.cosine_expert_norm == 0.0


@pytest.mark.parametrize("router, key, value, message", [
    ("switch", "switch.affinity", "l2", "model.moe.switch.affinity='l2' is unknown; choose 'dot'"),
    ("switch", "switch.cosine_dim", 16, "model.moe.switch.cosine_dim=16 applies only to cosine routing; add "
                                        "--config.model.moe.switch.affinity=cosine"),
    ("switch", "switch.cosine_expert_norm", 1.5, "model.moe.switch.cosine_expert_norm=1.5 applies only to cosine"),
    ("switch", "switch.cosine_temperature", 0.0, "model.moe.switch.cosine_temperature=0.0 must be > 0"),
    ("stablemoe", "stablemoe.cosine_expert_norm", -1.5, "model.moe.stablemoe.cosine_expert_norm=-1.5 must be >= 0"),
    ("stablemoe", "stablemoe.cosine_dim", -2, "model.moe.stablemoe.cosine_dim=-2 must be >= 0"),
])
def test_each_affinity_key_rejects_a_bad_value_in_one_line(router, key, value, message):
  config = default.get_config()
  config.model.moe.router = router
  section, name = key.split(".")
  config.model.moe[section][name] = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as error:
    validate_config(config)
  assert "\n" not in str(error.value)


def test_dot_stablemoe_with_an_expert_norm_is_an_error_naming_the_fix():
  config = default.get_config()
  config.model.moe.stablemoe.affinity, config.model.moe.stablemoe.cosine_dim = "dot", 0
  config.model.moe.stablemoe.cosine_expert_norm = 1.5
  with pytest.raises(ConfigError, match="cosine_expert_norm=1.5 applies only to cosine routing"):
    validate_config(config)
  config.model.moe.router = "hash"  # a preset key: another router ignores it
  validate_config(config)


# --- a tiny train run: the norm held at every step, the distilled router's freeze intact ---------------------------

@pytest.mark.parametrize("method", ["stablemoe_xmoe", "switch_xmoe"])
def test_xmoe_trains_with_the_norm_held_every_step_and_the_freeze_intact(tiny_config, prepared_ptb, tmp_path,
                                                                          method):
  config = methods.apply_overrides(tiny_config, methods.METHODS[method])
  if method == "switch_xmoe":
    config.model.moe.switch.fixed_routing = True  # two stages: the distilled router is frozen at the boundary
  config.train.steps, config.train.stage1_steps, config.train.learning_rate = 6, 3, 1e-2
  validate_config(config)
  share_prepared_ptb(prepared_ptb, tmp_path)
  exp = loop.Experiment(config, tmp_path)
  state = exp.init_state()
  step_fn = jax.jit(make_train_step(exp.model, exp.tx, exp.settings, exp.task))
  batches = exp.data.train_iterator(4, 16, seed=0)
  centroids, distilled, losses = [], [], []
  for _ in range(6):
    state, metrics = step_fn(state, next(batches))
    params = jax.device_get(state.params)
    centroids.append([params[layer]["router"]["centroids"] for layer in sorted(params) if "router" in params[layer]])
    distilled.append(params["moe_0"]["router"]["distilled_router"])
    losses.append(float(metrics["task_loss"]))
  assert centroids[0] and np.all(np.isfinite(losses))
  for step in centroids:
    for c in step:
      np.testing.assert_allclose(_row_norms(c), 1.5, rtol=2e-6)
  assert not np.allclose(centroids[0][0], centroids[-1][0])  # they turn
  # Stage 1 is steps 0-2: the distilled router learns in it and is bit-for-bit frozen after it.
  assert not jax.tree.all(jax.tree.map(np.array_equal, distilled[0], distilled[2]))
  assert jax.tree.all(jax.tree.map(np.array_equal, distilled[2], distilled[5]))

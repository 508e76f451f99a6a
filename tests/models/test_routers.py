"""Routers and dense baselines against hand-computed values and scipy; config errors. In training on real data (the
StableMoE freeze, each router's run): test_routers_training.py."""
from __future__ import annotations

import dataclasses

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util
from scipy.optimize import linear_sum_assignment

from configs import default
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.models import distill, hash_router, routers, stablemoe_router
from stablemoe_jax.models.balanced_assignment import balanced_assignment
from stablemoe_jax.models.base_router import BalancedAssignment
from stablemoe_jax.models.hash_router import HashRouter, balanced_hash_table
from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.settings import DistilledRouterSettings, MoESettings, ModelSettings, absent_value, typed
from stablemoe_jax.models.learned_router import DistilledRouterSpec, LearnedRouter
from stablemoe_jax.models.switch_router import SwitchSoftmax
from stablemoe_jax.models.transformer import TransformerLM, moe_positions

from tests.conftest import MAIN, REPO


def apply_router(router, params, h, ids, stage1=True, deterministic=False, rng=0):
  return router.apply({"params": params}, h, ids, jnp.array(stage1), deterministic,
                      rngs={"dropout": jax.random.key(rng)})


# --- Switch ------------------------------------------------------------------------------------------------------

def test_switch_assignment_gate_and_balance_loss_hand_computed():
  # Centroids = identity, so the scores are h itself: 4 tokens, 2 experts.
  h = jnp.array([[2.0, 0.0], [1.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
  router = LearnedRouter(num_experts=2, policy=SwitchSoftmax(balance_weight=0.5, z_loss_weight=0.1), centroid_gain=0.0)
  params = {"centroids": jnp.eye(2)}
  routing = apply_router(router, params, h, jnp.zeros(4, jnp.int32))
  np.testing.assert_array_equal(routing.expert_index[:, 0], [0, 0, 1, 0])
  p = lambda a, b: np.exp(a) / (np.exp(a) + np.exp(b))
  probs0 = np.array([p(2, 0), p(1, 0), p(0, 1), p(3, 1)])  # P(expert 0) per token
  np.testing.assert_allclose(routing.gate[:, 0], [probs0[0], probs0[1], 1 - probs0[2], probs0[3]], rtol=1e-6)
  # f = (3/4, 1/4); P = mean probs; loss = 0.5 * N * sum f_i P_i.
  mean0 = probs0.mean()
  want = 0.5 * 2 * (0.75 * mean0 + 0.25 * (1 - mean0))
  assert float(routing.losses.balance) == pytest.approx(want, rel=1e-6)
  lse = np.log(np.exp(h).sum(-1))
  assert float(routing.losses.z_loss) == pytest.approx(0.1 * np.mean(lse**2), rel=1e-6)
  # A uniform router gives the balance loss its minimum, the weight itself.
  uniform = apply_router(router, {"centroids": jnp.zeros((2, 2))}, h, jnp.zeros(4, jnp.int32))
  assert float(uniform.losses.balance) == pytest.approx(0.5)


def test_switch_jitter_only_in_training_and_z_loss_off_by_default():
  h = jax.random.normal(jax.random.key(0), (64, 8))
  router = LearnedRouter(num_experts=4, policy=SwitchSoftmax(), centroid_gain=0.0, jitter=0.5)
  params = router.init(jax.random.key(1), h, jnp.zeros(64, jnp.int32), jnp.array(True))["params"]
  train_a = apply_router(router, params, h, None, rng=1)
  train_b = apply_router(router, params, h, None, rng=2)
  evaluation = apply_router(router, params, h, None, deterministic=True)
  assert not np.allclose(train_a.gate[:, 0], train_b.gate[:, 0])  # the noise differs per rng ...
  scores = np.asarray(h) @ np.asarray(params["centroids"]).T
  np.testing.assert_allclose(evaluation.gate[:, 0], jax.nn.softmax(scores).max(-1), rtol=1e-5)  # ... and is off at eval
  assert set(train_a.losses.present()) == {"balance"}


# --- auxiliary losses: values and gradients through the router, against numpy closed forms ------------------------

def _sigmoid(v):
  return 1 / (1 + np.exp(-v))


def randomized_like(params, seed=5):
  """Every parameter replaced by N(0, 0.5) noise."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def _router_loss_grads(router, params, h, ids, name):
  """d losses.<name> / d(centroids, h) through the whole router call (as the train step differentiates it)."""
  def loss(centroids, h):
    return getattr(apply_router(router, {**params, "centroids": centroids}, h, ids).losses, name)
  return jax.value_and_grad(loss, argnums=(0, 1))(params["centroids"], h)


def test_stablemoe_balance_loss_gradient_through_the_router_matches_numpy_closed_form():
  """Reference: L = alpha / T * sum_t c_{a_t} sigmoid(s_{t a_t}), c_i = (|A_i| - T/N) / (T/N), s = h E^T, so
  dL/dE_i = alpha / T * c_i * sum_{t in A_i} sigma'(s_ti) h_t and dL/dh_t = alpha / T * c_{a_t} sigma'(s_{t a_t}) E_{a_t}."""
  tokens, experts, d, alpha = 24, 4, 6, 0.3
  router = stablemoe_router.StableMoERouter(num_experts=experts, vocab_size=7, distill_dim=3, balance_alpha=alpha)
  h = jax.random.normal(jax.random.key(0), (tokens, d))
  ids = jax.random.randint(jax.random.key(1), (tokens,), 0, 7)
  params = router.init(jax.random.key(2), h, ids, jnp.array(True))["params"]
  skew = jnp.zeros((experts, d)).at[0].set(0.8)  # an unbalanced assignment: non-zero coefficients c_i
  params = {**params, "centroids": params["centroids"] * 10 + skew}
  value, (grad_e, grad_h) = _router_loss_grads(router, params, h, ids, "balance")
  hn, en = np.asarray(h, np.float64), np.asarray(params["centroids"], np.float64)
  s = hn @ en.T
  a = s.argmax(-1)
  counts = np.bincount(a, minlength=experts)
  mean = tokens / experts
  c = (counts - mean) / mean
  assert np.abs(c).max() > 0.2  # the test needs an unbalanced routing
  picked = s[np.arange(tokens), a]
  np.testing.assert_allclose(value, alpha / tokens * np.sum(c[a] * _sigmoid(picked)), rtol=1e-5)
  dsig = _sigmoid(picked) * (1 - _sigmoid(picked))
  want_e = np.zeros_like(en)
  np.add.at(want_e, a, (alpha / tokens * c[a] * dsig)[:, None] * hn)
  want_h = (alpha / tokens * c[a] * dsig)[:, None] * en[a]
  np.testing.assert_allclose(grad_e, want_e, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(grad_h, want_h, rtol=1e-4, atol=1e-7)
  assert np.abs(want_e).max() > 1e-3 and np.abs(want_h).max() > 1e-3


def test_switch_balance_and_z_loss_gradients_through_the_router_match_numpy_closed_forms():
  """Reference, with p = softmax(s), s = h E^T, f the (constant) assigned fractions, z_t = logsumexp(s_t):
  balance B = w N sum_i f_i mean_t p_ti has dB/ds_tk = w N / T * p_tk (f_k - sum_i f_i p_ti);
  z-loss Z = w_z mean_t z_t^2 has dZ/ds_tk = 2 w_z / T * z_t p_tk; then d/dE = (d/ds)^T h and d/dh = (d/ds) E."""
  tokens, experts, d, w, wz = 20, 4, 5, 0.5, 0.1
  router = LearnedRouter(num_experts=experts, policy=SwitchSoftmax(balance_weight=w, z_loss_weight=wz),
                         centroid_gain=0.0)
  h = jax.random.normal(jax.random.key(3), (tokens, d))
  params = {"centroids": jax.random.normal(jax.random.key(4), (experts, d)) + jnp.zeros((experts, d)).at[1].set(0.7)}
  hn, en = np.asarray(h, np.float64), np.asarray(params["centroids"], np.float64)
  s = hn @ en.T
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  f = np.bincount(s.argmax(-1), minlength=experts) / tokens
  z = np.log(np.exp(s).sum(-1))
  ds = {"balance": w * experts / tokens * p * (f[None, :] - (p @ f)[:, None]),
        "z_loss": 2 * wz / tokens * z[:, None] * p}
  values = {"balance": w * experts * np.sum(f * p.mean(0)), "z_loss": wz * np.mean(z**2)}
  for name in ("balance", "z_loss"):
    value, (grad_e, grad_h) = _router_loss_grads(router, params, h, None, name)
    np.testing.assert_allclose(value, values[name], rtol=1e-5)
    np.testing.assert_allclose(grad_e, ds[name].T @ hn, rtol=1e-4, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(grad_h, ds[name] @ en, rtol=1e-4, atol=1e-7, err_msg=name)
    assert np.abs(ds[name]).max() > 1e-3


@pytest.mark.parametrize("router_name", ["stablemoe", "switch_fixed"])
def test_distillation_loss_is_weighted_by_distill_weight(router_name):
  """Reference: distill_weight (0.3, set in the config as a user would) x the numpy cross-entropy of the distilled
  router's logits (embedding @ centroids^T of each token id) against the greedy expert of the centroids."""
  tokens, experts, d, vocab, weight = 16, 4, 6, 9, 0.3
  moe = default.get_config().model.moe
  moe.num_experts, moe.distilled_router.dim, moe.distilled_router.distill_weight = experts, 3, weight
  moe.stablemoe.affinity, moe.stablemoe.cosine_dim = "dot", 0  # the reference's greedy expert: argmax of h . E_i
  if router_name == "switch_fixed":
    moe.router, moe.switch.fixed_routing = "switch", True
  router = routers.make_router(typed(MoESettings, moe), vocab_size=vocab)
  h = jax.random.normal(jax.random.key(0), (tokens, d))
  ids = jax.random.randint(jax.random.key(1), (tokens,), 0, vocab)
  params = randomized_like(router.init(jax.random.key(2), h, ids, jnp.array(True))["params"])
  routing = apply_router(router, params, h, ids, deterministic=True)
  distilled = jax.tree.map(lambda a: np.asarray(a, np.float64), params["distilled_router"])
  logits = distilled["embedding"][np.asarray(ids)] @ distilled["centroids"].T
  target = np.argmax(np.asarray(h, np.float64) @ np.asarray(params["centroids"], np.float64).T, axis=-1)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  cross_entropy = -np.mean(log_probs[np.arange(tokens), target])
  assert float(routing.losses.distill) == pytest.approx(weight * cross_entropy, rel=1e-5)
  assert float(routing.stats.distill_loss) == pytest.approx(cross_entropy, rel=1e-5)  # unweighted


# --- BASE --------------------------------------------------------------------------------------------------------

def scipy_optimum(a):
  capacity = a.shape[0] // a.shape[1]
  repeated = np.repeat(a, capacity, axis=1)
  rows, cols = linear_sum_assignment(repeated, maximize=True)
  return repeated[rows, cols].sum()


def test_base_hand_computed_balanced_assignment():
  # Greedy would send tokens 0, 1, 2 to expert 0; the best balanced split moves token 1 (the cheapest move: 0.5).
  a = np.array([[3.0, 0.0], [1.0, 0.5], [2.0, 0.0], [0.0, 1.0]], np.float32)
  index, info = balanced_assignment(jnp.array(a))
  np.testing.assert_array_equal(index, [0, 1, 0, 1])
  assert bool(info["converged"])


@pytest.mark.parametrize("tokens, experts, seed", [(12, 3, 0), (24, 4, 1), (32, 8, 2), (40, 4, 3), (64, 16, 4)])
def test_base_assignment_is_balanced_and_within_its_bound_of_scipy(tokens, experts, seed):
  a = np.random.RandomState(seed).randn(tokens, experts).astype(np.float32) * (1 + seed)
  index, info = jax.jit(balanced_assignment)(jnp.array(a))
  index = np.asarray(index)
  np.testing.assert_array_equal(np.bincount(index, minlength=experts), tokens // experts)
  assert bool(info["converged"])
  gap = scipy_optimum(a) - a[np.arange(tokens), index].sum()
  assert -1e-4 <= gap <= tokens * float(info["eps_final"]) + 1e-4


def test_base_balanced_on_random_inputs_with_groups_greedy_at_inference_sigmoid_gate_no_loss():
  h = jax.random.normal(jax.random.key(0), (2 * 96, 16))
  router = LearnedRouter(num_experts=8, policy=BalancedAssignment(num_groups=2), centroid_gain=0.1)
  params = router.init(jax.random.key(1), h, None, jnp.array(True))["params"]
  params = {"centroids": params["centroids"] * 20 + jnp.arange(8.0)[:, None] * 0.3}  # skewed: greedy unbalanced
  routing = apply_router(router, params, h, None)
  for group in np.asarray(routing.expert_index[:, 0]).reshape(2, 96):
    np.testing.assert_array_equal(np.bincount(group, minlength=8), 12)
  scores = np.asarray(h) @ np.asarray(params["centroids"]).T
  np.testing.assert_allclose(routing.gate[:, 0], 1 / (1 + np.exp(-scores[np.arange(192), routing.expert_index[:, 0]])), rtol=1e-5)
  assert routing.losses.present() == {} and float(routing.stats.auction_converged) == 1.0
  inference = apply_router(router, params, h, None, deterministic=True)
  greedy = np.argmax(scores, -1)
  np.testing.assert_array_equal(inference.expert_index[:, 0], greedy)
  assert np.bincount(greedy, minlength=8).max() > 24  # so the balanced assignment above did real work


# --- Hash --------------------------------------------------------------------------------------------------------

def test_hash_is_deterministic_per_seed_gate_one_no_loss():
  ids = jnp.arange(50).reshape(2, 25)
  h = jnp.zeros((50, 4))
  make = lambda seed: HashRouter(num_experts=4, vocab_size=50, seed=seed)
  tables = [make(s).init(jax.random.key(k), h, ids, jnp.array(True))["params"]["table"] for s, k in
            [(0, 0), (0, 1), (1, 0)]]
  np.testing.assert_array_equal(tables[0], tables[1])  # the init key does not matter, the seed does
  assert not np.array_equal(tables[0], tables[2])
  routing = apply_router(make(0), {"table": tables[0]}, h, ids)
  np.testing.assert_array_equal(routing.expert_index[:, 0], np.asarray(tables[0], int))
  np.testing.assert_array_equal(routing.gate[:, 0], 1.0)
  assert routing.losses.present() == {}


def test_balanced_hash_table_bin_packs_by_frequency():
  counts = np.array([10, 1, 6, 5, 0, 3])
  table = balanced_hash_table(counts, 2, seed=0)
  # Decreasing counts 10, 6, 5, 3, 1, 0 (ids 0, 2, 3, 5, 1, 4) go to the lighter expert:
  # 10 -> e0 (10, 0), 6 -> e1 (10, 6), 5 -> e1 (10, 11), 3 -> e0 (13, 11), 1 -> e1 (13, 12), 0 -> e1.
  assert list(table[[0, 2, 3, 5, 1, 4]]) == [0, 1, 1, 0, 1, 1]
  zipf = (1000 / np.arange(1, 2001)).astype(int)
  loads = np.bincount(balanced_hash_table(zipf, 8, seed=3), weights=zipf, minlength=8)
  assert loads.max() - loads.min() <= zipf.max()  # a greedy packing is within one item of even
  random_loads = np.bincount(hash_router.random_hash_table(2000, 8, 3), weights=zipf, minlength=8)
  assert loads.max() - loads.min() < random_loads.max() - random_loads.min()
  np.testing.assert_array_equal(balanced_hash_table(zipf, 8, seed=3), balanced_hash_table(zipf, 8, seed=3))


# --- distilled router variants -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["embedding", "cnn", "transformer"])
def test_distilled_routers_are_causal(kind):
  spec = DistilledRouterSpec(kind=kind, dim=8, kernel_size=3, num_layers=2, num_heads=2)
  router = distill.make_distilled_router(spec, vocab_size=20, num_experts=4)
  ids = jax.random.randint(jax.random.key(0), (2, 10), 0, 20)
  params = router.init(jax.random.key(1), ids)["params"]
  logits = np.asarray(router.apply({"params": params}, ids)).reshape(2, 10, 4)
  changed = ids.at[:, 6].set((ids[:, 6] + 1) % 20)
  after = np.asarray(router.apply({"params": params}, changed)).reshape(2, 10, 4)
  np.testing.assert_array_equal(logits[:, :6], after[:, :6])  # positions before 6 never see token 6
  assert not np.allclose(logits[:, 6], after[:, 6])
  if kind != "embedding":  # ... while the context matters for the contextual variants
    assert not np.allclose(logits[:, 7:9], after[:, 7:9])


# --- dense baselines ---------------------------------------------------------------------------------------------

def tiny_model_config(**moe):
  config = default.get_config().model
  config.vocab_size, config.d_model, config.num_heads, config.num_layers, config.d_ff = 300, 16, 2, 2, 32
  config.max_len, config.moe.num_experts, config.moe.sublayers_per_expert = 8, 4, 2
  config.moe.distilled_router.dim = 6
  config.moe.update(moe)
  return config


def real_param_count(config):
  params = nn.unbox(TransformerLM(typed(ModelSettings, config)).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32), jnp.array(True))["params"])
  return sum(x.size for x in jax.tree.leaves(params)), params


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["middle", "scattered"])
def test_dense_deeper_and_wider_match_the_moe_total_within_one_percent(placement):
  config = tiny_model_config(placement=placement, sublayers_per_expert=3 if placement == "scattered" else 2)
  moe_total, _ = real_param_count(config)
  config.moe.enabled = False
  standard, _ = real_param_count(config)
  for how in ("deeper", "wider"):
    config.dense_match = how
    total, params = real_param_count(config)
    assert abs(total / moe_total - 1) < 0.01, (how, total, moe_total)
    assert not any(k.startswith("moe_") for k in params) and any(k.startswith("dense_ffn_") for k in params)
    w_in = params["dense_ffn_0"]["w_in"]
    if how == "deeper":
      assert w_in.shape[1] > 2 and abs(w_in.shape[-1] - 32) <= 8  # more sublayers of about the expert width
    else:
      assert w_in.shape[1] == (1 if placement == "scattered" else 2) and w_in.shape[-1] > 64  # wider sublayers
  assert standard < 0.7 * moe_total


@pytest.mark.parametrize("placement, sublayers", [("middle", 2), ("scattered", 3)])
def test_dense_flops_has_the_moe_models_flops_a_token_less_its_routers(placement, sublayers):
  from stablemoe_jax.models import flops as flops_lib
  config = tiny_model_config(placement=placement, sublayers_per_expert=sublayers)
  init = lambda c: jax.eval_shape(lambda: TransformerLM(typed(ModelSettings, c)).init(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32), jnp.array(True)))["params"]
  moe_params = init(config)
  config.moe.enabled, config.dense_match = False, "flops"
  dense_params = init(config)
  flat = traverse_util.flatten_dict(nn.unbox(moe_params))
  # The routers' matmuls: centroids [N, d] and the cosine routing's projection kernel (the default's affinity).
  router = sum(2 * math.prod(v.shape) for k, v in flat.items() if "router" in k and k[-1] in ("centroids", "kernel"))
  assert router > 0
  assert (flops_lib.forward_flops_per_token(dense_params, 8)
          == flops_lib.forward_flops_per_token(moe_params, 8) - router)
  # By hand: each MoE position holds one FFN [1, s, d, d_ff] with s = sublayers_per_expert / positions (at least 1).
  positions = len(moe_positions(config.num_layers, placement))
  ffn = nn.unbox(dense_params)["dense_ffn_0"]
  assert ffn["w_in"].shape == (1, max(1, sublayers // positions), 16, 32)


# --- config errors -----------------------------------------------------------------------------------------------

def test_default_router_sections_equal_the_registry_defaults_but_their_preset_keys():
  moe = default.get_config().model.moe
  for name, entry in routers.ROUTERS.items():
    fields = {f.name for f in dataclasses.fields(entry.settings)}
    assert set(moe[name].keys()) == fields, name
    assert set(entry.preset_keys) <= fields, name
    differing = {key for key in fields if moe[name][key] != absent_value(entry.settings, key)}
    assert differing <= set(entry.preset_keys), (name, differing)
    assert type(settings_lib.typed(settings_lib.MoESettings, moe).router_settings(name)) is entry.settings, name
  # The CPU default's two small-scale deviations (docs/tuning.md); a config without the keys has the paper's values.
  assert moe.stablemoe.balance_scope == "all" and absent_value(routers.ROUTERS["stablemoe"].settings,
                                                               "balance_scope") == "assigned"
  assert moe.stablemoe.affinity == "cosine" and absent_value(routers.ROUTERS["stablemoe"].settings, "affinity") == "dot"
  assert moe.distilled_router.to_dict() == dataclasses.asdict(DistilledRouterSettings())


@pytest.mark.parametrize("router, key, value, message", [
    ("stablemoe", "switch.balance_weight", 0.1, "model.moe.switch.balance_weight=0.1 is a setting of router 'switch'"),
    ("base", "stablemoe.balance_alpha", 0.5, "--config.model.moe.router=stablemoe"),
    ("switch", "switch.z_loss_weight", -1.0, "model.moe.switch.z_loss_weight=-1.0 must be >= 0"),
    ("switch", "switch.jitter", 1.5, "model.moe.switch.jitter=1.5 must lie in"),
    ("hash", "hash.table", "zipf", "model.moe.hash.table='zipf' is unknown"),
    ("stablemoe", "distilled_router.kind", "lstm", "kind='lstm' is unknown"),
])
def test_router_settings_are_validated_only_for_the_chosen_router(router, key, value, message):
  config = default.get_config()
  config.model.moe.router = router
  section, name = key.split(".")
  config.model.moe[section][name] = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
    validate_config(config)


def test_base_needs_tokens_divisible_by_experts():
  config = default.get_config()
  config.model.moe.router, config.model.moe.num_experts = "base", 24
  with pytest.raises(ConfigError, match="not divisible by model.moe.num_groups"):
    validate_config(config)


def test_command_line_errors_for_router_settings(tmp_path):
  import os
  import subprocess
  run = lambda *args: subprocess.run([*MAIN, "--workdir", str(tmp_path), *args], cwd=REPO, env=dict(os.environ),
                                     capture_output=True, text=True, timeout=300)
  unselected = run("--config.model.moe.base.fixed_routing=True")
  assert unselected.returncode == 2 and "Traceback" not in unselected.stderr
  assert "model.moe.base.fixed_routing=True is a setting of router 'base'" in unselected.stderr
  unknown = run("--config.model.moe.router=switch", "--config.model.moe.switch.balance_wieght=0.1")
  assert unknown.returncode == 2 and 'Did you mean "balance_weight"' in unknown.stderr

"""Top-k routing (Switch top-k), top-k dispatch and shared experts against per-token loops worked out by hand."""
import dataclasses
import math
import flax.linen as nn
import jax
from flax import traverse_util
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from tests.conftest import jit_init

from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.models import routers
from stablemoe_jax.core.settings import DistilledRouterSettings
from stablemoe_jax.models.moe import make_moe_layer
from stablemoe_jax.models.routing import AUX_LOSS, METRICS, ROUTING
from stablemoe_jax.models.switch_router import SwitchSoftmax, switch_balance_loss

D, FF, E, SUB, VOCAB = 8, 16, 4, 2, 11


def moe_config(router="switch", top_k=2, capacity_factor=2.0, num_groups=1, dispatcher="index", shared_experts=0,
               shuffle_tokens=False):
  return ml_collections.ConfigDict(dict(
      router=router, num_experts=E, capacity_factor=capacity_factor, eval_capacity_factor=capacity_factor, d_ff=FF,
      num_groups=num_groups, shuffle_tokens=shuffle_tokens, dispatcher=dispatcher, eval_dispatcher=dispatcher,
      shared_experts=shared_experts,
      switch=dict(balance_weight=0.01, z_loss_weight=0.0, jitter=0.0, fixed_routing=False, top_k=top_k),
      stablemoe=dict(balance_alpha=0.3, centroid_gain=0.1),
      hash=dict(table="random", seed=0),
      distilled_router={**dataclasses.asdict(DistilledRouterSettings()), "dim": 5},
  ))


def randomized(params, seed=1):
  """Every parameter replaced by N(0, 0.5) noise, so the zero-initialised output projections matter too."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def np_ffn_stack(ex, e, h):
  """What expert e's stack of SUB pre-LN ReLU sublayers adds to h (float64)."""
  y = h.copy()
  for s in range(SUB):
    z = (y - y.mean()) / np.sqrt(y.var() + 1e-5) * ex["ln_scale"][e, s] + ex["ln_bias"][e, s]
    z = np.maximum(z @ ex["w_in"][e, s] + ex["b_in"][e, s], 0.0) @ ex["w_out"][e, s] + ex["b_out"][e, s]
    y = y + z
  return y - h


def np_softmax(x):
  x = np.exp(x - x.max())
  return x / x.sum()


def hand_topk_layer(params, x, top_k, capacity, num_groups=1, shared=0):
  """Switch top-k by hand: softmax of h . E_i, the k most probable experts, their probabilities renormalised;
  capacity per (group, expert) filled by every token's first choice (in token order), then every second choice;
  out = h + sum of the kept choices' gated expert outputs + every shared expert's output."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  tokens = x.shape[0]
  group = tokens // num_groups
  choices, gates = [], []
  for t in range(tokens):
    probs = np_softmax(p["router"]["centroids"] @ x[t])
    ranked = sorted(range(E), key=lambda i: -probs[i])[:top_k]
    choices.append(ranked)
    gates.append([probs[i] / sum(probs[j] for j in ranked) for i in ranked])
  kept = np.zeros((tokens, top_k), bool)
  for g in range(num_groups):
    load = np.zeros(E, int)
    for j in range(top_k):  # all first choices before any second choice
      for t in range(g * group, (g + 1) * group):
        e = choices[t][j]
        if load[e] < capacity:
          load[e] += 1
          kept[t, j] = True
  out = np.array(x, np.float64)
  for t in range(tokens):
    for j in range(top_k):
      if kept[t, j]:
        out[t] += gates[t][j] * np_ffn_stack(p["experts"], choices[t][j], x[t])
    for i in range(shared):
      out[t] += np_ffn_stack(p["shared_experts"], i, x[t])
  return out, np.array(choices), np.array(gates), kept


def init_layer(cfg, tokens=24, seed=0):
  layer = make_moe_layer(cfg, VOCAB, SUB, FF)
  x = jax.random.normal(jax.random.key(seed), (2, tokens // 2, D))
  ids = jax.random.randint(jax.random.key(seed + 1), (2, tokens // 2), 0, VOCAB)
  params = randomized(nn.unbox(jit_init(layer, 2, x, ids, jnp.array(True))["params"]))
  return layer, params, x, ids


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
                          mutable=[METRICS, AUX_LOSS, ROUTING])
  group = 24 // num_groups
  capacity = capacity_lib.expert_capacity(group, E, capacity_factor, top_k=2)  # ceil(cf * 2 * Tg / E), <= Tg
  assert capacity == (group if capacity_factor in (0.0, 2.0) else math.ceil(0.75 * 2 * group / E))
  want, choices, gates, kept = hand_topk_layer(params, np.asarray(x, np.float64).reshape(24, D), 2, capacity,
                                               num_groups)
  assert capacity == group or not kept.all()  # below Tg slots some choices are dropped: capacity counts choices
  np.testing.assert_allclose(np.asarray(got).reshape(24, D), want, rtol=2e-4, atol=2e-4)
  metrics, routing = sown[METRICS], sown[ROUTING]
  np.testing.assert_allclose(metrics["dropped_fraction"][0], 1 - kept.mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["load"][0], np.bincount(choices.reshape(-1), minlength=E) / 48, rtol=1e-6)
  np.testing.assert_allclose(metrics["mean_gate"][0], gates[:, 0].mean(), rtol=1e-5)  # the first choice's gate
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
  plain = make_moe_layer(moe_config(router=router, top_k=top_k), VOCAB, SUB, FF)
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


def test_registry_top_k_and_gate_kind():
  cfg = moe_config(top_k=3)
  assert routers.top_k(cfg) == 3 and routers.gate_kind(cfg) == "softmax"
  assert routers.top_k(moe_config(router="hash")) == 1 and routers.gate_kind(moe_config(router="hash")) == "fixed"
  assert routers.gate_kind(moe_config(router="stablemoe")) == "sigmoid"


# --- the registry: every router fact outside models/ comes from it --------------------------------------------------

def test_nothing_outside_models_branches_on_a_router_name():
  # A router's name as a string literal appears outside models/ only in the comparison's table of methods (config
  # values, as on the command line); any other use (a comparison, a dict keyed by names) would be a branch.
  import pathlib
  import re
  root = pathlib.Path(routers.__file__).parents[1]
  names = "|".join(sorted(routers.ROUTERS))
  pattern = re.compile(rf"""["']({names})["']""")
  found = []
  for path in sorted(root.rglob("*.py")):
    relative = path.relative_to(root).as_posix()
    if relative.startswith(("models/", "core/settings/")) or relative == "compare/methods.py":  # config values
      continue
    found += [f"{relative}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
              if pattern.search(line)]
  assert found == []


@pytest.mark.parametrize("router, settings", [("stablemoe", {}), ("switch", {"top_k": 2, "z_loss_weight": 1e-3}),
                                              ("hash", {})])
def test_sown_losses_are_those_the_registry_names(router, settings):
  cfg = moe_config(router=router)
  for key, value in settings.items():
    cfg[router][key] = value
  layer, params, x, ids = init_layer(cfg)
  _, sown = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False, mutable=[AUX_LOSS])
  names = {key[-1] for key in traverse_util.flatten_dict(sown.get(AUX_LOSS, {}))}
  assert names <= set(routers.ROUTERS[router].losses)
  assert ("balance" in names) == (router != "hash")


def test_post_update_hook_comes_from_the_registry():
  from configs import default
  config = default.get_config()
  assert routers.post_update_hook(config.model) is None  # the default's cosine router holds no norm
  config.model.moe.stablemoe.cosine_expert_norm = 1.5
  hook = routers.post_update_hook(config.model)
  params = {"moe_0": {"router": {"centroids": jnp.ones((4, 16))}}, "embed": {"embedding": jnp.ones((3, 2))}}
  out = hook(params)
  np.testing.assert_allclose(np.linalg.norm(out["moe_0"]["router"]["centroids"], axis=-1), 1.5, rtol=1e-6)
  np.testing.assert_array_equal(out["embed"]["embedding"], params["embed"]["embedding"])
  config.model.moe.router = "hash"
  assert routers.post_update_hook(config.model) is None


# --- config errors ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"router": "switch", "switch.top_k": 0}, "model.moe.switch.top_k=0 must be an integer in [1, model.moe.num_experts=8]"),
    ({"router": "switch", "switch.top_k": 9}, "model.moe.switch.top_k=9 must be an integer in [1, "),
    ({"router": "switch", "switch.top_k": 2, "switch.fixed_routing": True}, "needs model.moe.switch.fixed_routing=False"),
    ({"shared_experts": -1}, "model.moe.shared_experts=-1 must be an integer >= 0"),
    ({"router": "stablemoe", "switch.top_k": 2}, "model.moe.switch.top_k=2 is a setting of router 'switch'"),
])
def test_bad_top_k_and_shared_experts_are_one_config_error(changes, message):
  from configs import default
  from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
  config = default.get_config()
  for key, value in changes.items():
    target = config.model.moe
    *sections, name = key.split(".")
    for section in sections:
      target = target[section]
    target[name] = value
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert message in str(error.value) and "\n" not in str(error.value)


def test_bad_top_k_exits_2_with_one_line_from_the_command_line(tmp_path):
  import os
  import subprocess
  from tests.conftest import MAIN, REPO
  result = subprocess.run([*MAIN, "--workdir", str(tmp_path), "--config.model.moe.router=switch",
                           "--config.model.moe.switch.top_k=0"], cwd=REPO, env=dict(os.environ), capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  errors = [line for line in result.stderr.splitlines() if "top_k" in line]
  assert len(errors) == 1 and "model.moe.switch.top_k=0 must be an integer in [1, " in errors[0]


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
  return health.GuardSettings.from_config(config)


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
  _, sown = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False, mutable=[METRICS])
  window = {f"moe/moe_0/{name}": np.asarray(value[0]).tolist()
            for name, value in sown[METRICS].items() if name in (*health.HEALTH_METRICS, "load")}
  np.testing.assert_allclose(window["moe/moe_0/load"], [0.5, 0.5, 0, 0])
  settings = _guard_settings(router="switch", num_experts=E, **{"switch.top_k": 2})
  guard = health.CollapseGuard(settings, start_step=10)
  found = guard.observe(20, window)
  assert [c.dead for c in found if c.dead] == [True]
  assert "the two busiest of its 4 experts take 100.0% of the tokens" in found[0].message()


@pytest.mark.slow
def test_switch_top2_with_a_shared_expert_trains_end_to_end(tiny_config, prepared_ptb, tmp_path):
  from tests.conftest import share_prepared_ptb
  from stablemoe_jax.experiment import loop
  share_prepared_ptb(prepared_ptb, tmp_path)
  tiny_config.model.moe.router, tiny_config.model.moe.switch.top_k = "switch", 2
  tiny_config.model.moe.shared_experts = 1
  tiny_config.train.steps, tiny_config.train.stage1_steps, tiny_config.train.eval_every = 8, 2, 100
  summary = loop.train_and_evaluate(tiny_config, tmp_path)
  assert np.isfinite(summary["test"]["perplexity"]) and summary["health"]["guard"]["top_k"] == 2
  from stablemoe_jax.train.metrics import read_metrics
  records = [r for r in read_metrics(tmp_path) if "loss" in r]
  assert records and all(np.isfinite(r["loss"]) for r in records)
  assert all(abs(sum(r["moe/moe_0/load"]) - 1) < 1e-5 for r in records)


def test_a_checkpoint_config_written_before_the_new_keys_restores_at_their_old_values():
  # model.moe.shared_experts and switch.top_k did not exist before issue 52: a checkpoint's config without them
  # compares equal to one at 0 and 1 (the runs it reproduces), and differs from any other value.
  from configs import default
  from stablemoe_jax.train import checkpoint
  current = default.get_config().to_dict()
  old = default.get_config().to_dict()
  del old["model"]["moe"]["shared_experts"], old["model"]["moe"]["switch"]["top_k"], old["model"]["moe"]["deepseek"]
  compare = lambda a, b: checkpoint._differences(checkpoint._comparable(a, True), checkpoint._comparable(b, True))
  assert compare(old, current) == []
  current["model"]["moe"]["shared_experts"] = 1
  current["model"]["moe"]["switch"]["top_k"] = 2
  assert compare(old, current) == ["model.moe.shared_experts: checkpoint '<absent>', this config 1",
                                   "model.moe.switch.top_k: checkpoint '<absent>', this config 2"]
  assert "top_k" in default.get_config().model.moe.switch  # the config itself is unchanged by the comparison


class _OneLayerModel(nn.Module):
  """A model of one MoE layer named moe_0, called as the routing analysis calls a model."""
  cfg: ml_collections.ConfigDict

  @nn.compact
  def __call__(self, x, ids, in_stage1, deterministic=True):
    return make_moe_layer(self.cfg, VOCAB, SUB, FF, name="moe_0")(x, ids, in_stage1, deterministic)


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

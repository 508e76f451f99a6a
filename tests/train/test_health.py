"""Router health: the metrics, the contribution measure, the config and the comparison's columns (the verdict and its
guard: test_health_guard.py)."""
from __future__ import annotations

import dataclasses

import importlib
import math

import jax
import jax.numpy as jnp
from flax import linen as nn
import ml_collections
import numpy as np
import pytest
from tests.conftest import jit_init

from configs import default
from stablemoe_jax.core.settings import HealthSettings, from_config
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.analysis import cohesion, contribution
from stablemoe_jax.compare import report
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.experiment.step import token_nll
from stablemoe_jax.models import experts as experts_lib
from stablemoe_jax.models.routing import STATS, layer_stats, routing_health
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.train import health
from stablemoe_jax.train.metrics import read_metrics
from stablemoe_jax.core.settings import ModelSettings, typed
from stablemoe_jax.compare.comparison import Comparison

# --- the metrics ----------------------------------------------------------------------------------------------------

# 8 tokens, 4 experts: loads 4/8, 2/8, 2/8, 0; gates 0.001 and 0.005 are below 0.01, 0.01 itself is not.
EXPERT_INDEX = [0, 0, 0, 0, 1, 1, 2, 2]
GATES = [0.001, 0.5, 0.9, 0.01, 0.005, 0.2, 0.3, 0.7]


def test_health_metrics_of_a_hand_built_routing():
  metrics = jax.device_get(routing_health(jnp.array(EXPERT_INDEX, jnp.int32), jnp.array(GATES, jnp.float32), 4))
  entropy = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))  # = 1.5 ln 2
  assert metrics["mean_gate"] == pytest.approx(sum(GATES) / 8)
  assert metrics["low_gate_fraction"] == 2 / 8
  assert metrics["load_entropy"] == pytest.approx(entropy, rel=1e-6)
  assert metrics["load_balance"] == pytest.approx(0.75, rel=1e-6)  # 1.5 ln 2 / ln 4
  assert metrics["max_load"] == 0.5
  # Balanced and one-expert extremes.
  balanced = routing_health(jnp.arange(8, dtype=jnp.int32) % 4, jnp.ones(8), 4)
  assert float(balanced["load_balance"]) == pytest.approx(1.0) and float(balanced["max_load"]) == 0.25
  collapsed = routing_health(jnp.zeros(8, jnp.int32), jnp.zeros(8), 4)
  assert float(collapsed["load_balance"]) == 0.0 and float(collapsed["max_load"]) == 1.0
  assert float(collapsed["low_gate_fraction"]) == 1.0


# 4 tokens, top-2 of 3 experts: the gate metrics read each token's largest gate, wherever the router ranked it.
# Token 1's first choice carries the smaller gate (0.005, its largest 0.995: not low); token 2's largest is 0.008
# (low); token 3's is exactly 0.01 (not low).
TOPK_INDEX = [[0, 1], [1, 2], [2, 0], [0, 2]]
TOPK_GATES = [[0.6, 0.4], [0.005, 0.995], [0.008, 0.002], [0.01, 0.003]]


def test_topk_gate_metrics_read_each_tokens_largest_gate_in_the_log_and_the_analysis():
  metrics = jax.device_get(routing_health(jnp.array(TOPK_INDEX, jnp.int32), jnp.array(TOPK_GATES, jnp.float32), 3))
  assert metrics["mean_gate"] == pytest.approx((0.6 + 0.995 + 0.008 + 0.01) / 4)
  assert metrics["low_gate_fraction"] == 1 / 4
  counts = cohesion.RoutingCounts(num_experts=3, vocab_size=10)
  counts.add(token_ids=np.arange(4), expert_index=TOPK_INDEX, gate=TOPK_GATES)
  stats = counts.load_stats()
  assert stats["mean_gate"] == pytest.approx(float(metrics["mean_gate"]), rel=1e-6)
  assert stats["low_gate_fraction"] == 1 / 4


def test_analysis_load_stats_carry_the_same_metrics():
  counts = cohesion.RoutingCounts(num_experts=4, vocab_size=10)
  counts.add(token_ids=np.arange(8) % 10, expert_index=EXPERT_INDEX, gate=GATES)
  counts.add(token_ids=[1], expert_index=[3], gate=[0.0], mask=[0])  # padding: not counted
  stats = counts.load_stats()
  assert stats["low_gate_fraction"] == 2 / 8 and stats["max_load"] == 0.5
  assert stats["load_balance"] == pytest.approx(0.75)


def _tiny_model_config(router: str, **moe):
  config = default.get_config().model
  config.vocab_size, config.d_model, config.num_heads, config.num_layers, config.d_ff, config.max_len = (
      50, 16, 2, 2, 32, 16)
  config.dropout = 0.0
  config.moe.num_experts, config.moe.distilled_router.dim = 4, 8
  config.moe.router = router
  for key, value in moe.items():
    *section, leaf = key.split(".")
    node = config.moe
    for part in section:
      node = node[part]
    node[leaf] = value
  return config


ROUTER_CASES = [("stablemoe", {}), ("switch", {}), ("base", {}), ("hash", {}),
                ("switch", {"switch.fixed_routing": True}), ("base", {"base.fixed_routing": True})]


@pytest.mark.parametrize("router,moe", ROUTER_CASES)
def test_every_router_sows_the_health_metrics(router, moe):
  model = TransformerLM(typed(ModelSettings, _tiny_model_config(router, **moe)))
  tokens = np.random.default_rng(1).integers(0, 50, (2, 16)).astype(np.int32)

  @jax.jit
  def sown_metrics(tokens):
    params = jit_init(model, 0, tokens, jnp.array(True))["params"]
    _, sown = model.apply({"params": params}, tokens, jnp.array(True), deterministic=True, mutable=[STATS])
    return {name: getattr(layer_stats(sown)["moe_0"], name) for name in health.HEALTH_METRICS}

  values = {name: float(v) for name, v in sown_metrics(tokens).items()}
  assert 0.0 <= values["low_gate_fraction"] <= 1.0 and 0.0 <= values["load_balance"] <= 1.0 + 1e-6
  assert 0.25 <= values["max_load"] <= 1.0
  assert values["load_balance"] == pytest.approx(values["load_entropy"] / math.log(4), rel=1e-5)
  if router == "hash":
    assert values["mean_gate"] == 1.0 and values["low_gate_fraction"] == 0.0


# --- the contribution -----------------------------------------------------------------------------------------------

def test_zeroed_output_projections_make_the_expert_output_exactly_zero():
  shapes = jax.eval_shape(lambda: nn.meta.unbox(experts_lib.FFNExperts(3, 2, 8).init(jax.random.key(0), 6)))
  params = _noise(shapes["params"], scale=1.0)  # every parameter non-zero
  x = np.random.default_rng(1).standard_normal((3, 2, 5, 6)).astype(np.float32)
  ids, groups = np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32)
  apply = jax.jit(experts_lib.apply_ffn_experts, static_argnames="dropout")
  assert np.abs(np.asarray(apply(params, x, ids, groups, None))).min() > 0
  zeroed = contribution.without_layer({"moe_0": {"experts": params}}, "moe_0")["moe_0"]["experts"]
  for rng, rate in ((None, 0.0), (jax.random.key(3), 0.5)):  # evaluation (dropout off) and training dropout
    out = np.asarray(apply(zeroed, x, ids, groups, rng, dropout=rate))
    np.testing.assert_array_equal(out, np.zeros_like(out))


def _noise(tree, scale: float, base=None, seed: int = 0):
  """numpy leaves: ``base + scale * N(0, 1)`` with the shapes of ``tree`` (base: zeros)."""
  rng = np.random.default_rng(seed)
  noise = jax.tree.map(lambda s: scale * rng.standard_normal(s.shape).astype(np.float32), tree)
  return noise if base is None else jax.tree.map(lambda b, n: np.asarray(b) + n, base, noise)


def _lm_and_batch(router: str = "stablemoe"):
  config = _tiny_model_config(router)
  model = TransformerLM(typed(ModelSettings, config))
  tokens = np.random.default_rng(1).integers(0, 50, (4, 16)).astype(np.int32)
  params = jax.device_get(nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), tokens, jnp.array(True))["params"]))
  return config, model, params, tokens


def test_model_without_a_moe_layer_is_the_dense_model_with_the_same_parameters():
  config, model, params, tokens = _lm_and_batch()
  params = _noise(params, 0.1, base=params)
  dense_config = ml_collections.ConfigDict(config.to_dict())
  dense_config.moe.enabled = False
  dense_params = {k: v for k, v in params.items() if k != "moe_0"}
  dense = jax.jit(TransformerLM(typed(ModelSettings, dense_config)).apply)({"params": dense_params}, tokens, jnp.array(False)).logits()
  apply = jax.jit(model.apply)
  ablated = apply({"params": contribution.without_layer(params, "moe_0")}, tokens, jnp.array(False)).logits()
  full = apply({"params": params}, tokens, jnp.array(False)).logits()
  np.testing.assert_allclose(ablated, dense, rtol=1e-6, atol=1e-6)
  assert np.abs(np.asarray(full - dense)).max() > 1e-3


def test_contribution_is_exactly_zero_for_zero_experts_and_not_otherwise():
  _, model, params, tokens = _lm_and_batch()
  targets = jnp.roll(tokens, -1, axis=1)

  @jax.jit
  def loss(p):
    return jnp.mean(token_nll(model.apply({"params": p}, tokens, jnp.array(False)).logits(), targets))

  def evaluate(p, max_batches):
    value = float(loss(p))
    return {"loss": value, "perplexity": math.exp(value), "tokens": tokens.size}

  assert not np.any(np.asarray(params["moe_0"]["experts"]["w_out"]))  # a fresh model's experts output zeros
  fresh = contribution.layer_contributions(evaluate, params, max_batches=3)
  layer = fresh["layers"]["moe_0"]
  assert layer["loss_without_layer"] == fresh["loss"] and layer["relative_perplexity_increase"] == 0.0
  assert fresh["batches"] == 3 and list(fresh["layers"]) == ["moe_0"]
  trained = _noise(params, 0.2, base=params)
  layer = contribution.layer_contributions(evaluate, trained)["layers"]["moe_0"]
  assert layer["loss_without_layer"] != pytest.approx(float(loss(trained)), abs=1e-4)
  dense_params = {"block_0": {}, "dense_ffn_0": {"w_in": 0}}
  assert contribution.moe_layer_names(dense_params) == []
  assert contribution.layer_contributions(None, dense_params) == {"batches": "all", "layers": {}}  # not evaluated
  with pytest.raises(KeyError, match="not a MoE layer"):
    contribution.without_layer(params, "block_0")


def test_a_zeroed_expert_layer_is_dead_by_its_contribution():
  _, model, params, tokens = _lm_and_batch()
  params = _noise(params, 0.2, base=params)
  apply = jax.jit(lambda p: model.apply({"params": p}, tokens, jnp.array(False)).logits())
  targets = jnp.argmax(apply(params), axis=-1)  # what the whole model predicts: its layer is needed to fit them
  loss = jax.jit(lambda p: jnp.mean(token_nll(apply(p), targets)))

  def evaluate(p, max_batches):
    value = float(loss(p))
    return {"loss": value, "perplexity": math.exp(value), "tokens": tokens.size}

  config = default.get_config()
  config.train.warmup_steps, config.health.patience = 10, 1
  zeroed = contribution.without_layer(params, "moe_0")
  for p, dead in ((zeroed, True), (params, False)):
    worth = contribution.layer_contributions(evaluate, p)["layers"]["moe_0"]["relative_perplexity_increase"]
    guard = health.CollapseGuard(health.GuardSettings.from_settings(from_config(config)), start_step=10)
    assert bool(guard.observe_contribution(20, {"moe_0": worth})) == dead, worth



def test_with_shared_experts_the_verdict_judges_the_routed_experts_and_reports_the_whole_layer():
  """model.moe.shared_experts=1: the layer's worth is its routed experts' (the shared expert kept), so a layer whose
  routed experts output zeros is worth exactly 0 and dead, while the whole layer (shared expert removed too) is
  worth a lot; the whole layer removed is the dense model with the same parameters."""
  config = _tiny_model_config("stablemoe", shared_experts=1)
  model = TransformerLM(typed(ModelSettings, config))
  tokens = np.random.default_rng(1).integers(0, 50, (4, 16)).astype(np.int32)
  params = jax.device_get(nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), tokens, jnp.array(True))["params"]))
  params = _noise(params, 0.2, base=params)
  assert set(params["moe_0"]) >= {"experts", "shared_experts", "router"}
  apply = jax.jit(lambda p: model.apply({"params": p}, tokens, jnp.array(False)).logits())
  targets = jnp.argmax(apply(params), axis=-1)
  loss = jax.jit(lambda p: jnp.mean(token_nll(apply(p), targets)))

  def evaluate(p, max_batches):
    value = float(loss(p))
    return {"loss": value, "perplexity": math.exp(value), "tokens": tokens.size}

  routed_zero = contribution.without_layer(params, "moe_0")  # the routed experts output 0, the shared one works
  np.testing.assert_array_equal(routed_zero["moe_0"]["shared_experts"]["w_out"],
                                params["moe_0"]["shared_experts"]["w_out"])
  result = contribution.layer_contributions(evaluate, routed_zero, whole_layer=True)
  layer = result["layers"]["moe_0"]
  assert layer["loss_without_layer"] == result["loss"] and layer["relative_perplexity_increase"] == 0.0
  assert layer["whole_layer_relative_perplexity_increase"] > 0.05
  assert layer["perplexity_without_whole_layer"] == pytest.approx(math.exp(layer["loss_without_whole_layer"]))
  judged = health.verdict({"layers": {}, "contribution": result})
  assert judged["dead_layers"] == ["moe_0"] and "routed experts" in judged["verdict"]["moe_0"]["reasons"][0]
  assert judged["verdict"]["moe_0"]["whole_layer_contribution"] == layer["whole_layer_relative_perplexity_increase"]
  # The whole layer removed: the dense model of the same parameters.
  dense_config = ml_collections.ConfigDict(config.to_dict())
  dense_config.moe.enabled = False
  dense = jax.jit(lambda p: TransformerLM(typed(ModelSettings, dense_config)).apply({"params": p}, tokens, jnp.array(False)).logits())(
      {k: v for k, v in params.items() if k != "moe_0"})
  np.testing.assert_allclose(apply(contribution.without_layer(params, "moe_0", shared=True)), dense,
                             rtol=1e-6, atol=1e-6)
  # Training's evaluation points measure only the routed worth; a layer without shared experts has no whole-layer key.
  assert "whole_layer_relative_perplexity_increase" not in contribution.layer_contributions(
      evaluate, params)["layers"]["moe_0"]
  _, plain_model, plain, plain_tokens = _lm_and_batch()
  plain_loss = jax.jit(lambda p: jnp.mean(token_nll(plain_model.apply({"params": p}, plain_tokens, jnp.array(False)).logits(),
                                                    jnp.roll(plain_tokens, -1, axis=1))))
  plain_result = contribution.layer_contributions(
      lambda p, n: {"loss": float(plain_loss(p)), "perplexity": math.exp(float(plain_loss(p))), "tokens": 64},
      plain, whole_layer=True)
  assert set(plain_result["layers"]["moe_0"]) == {"loss_without_layer", "perplexity_without_layer",
                                                   "relative_perplexity_increase"}

# --- the config -----------------------------------------------------------------------------------------------------

def test_default_health_section_is_the_guard_defaults_and_every_preset_loads():
  assert default.get_config().health.to_dict() == dataclasses.asdict(HealthSettings())
  for name in ("default", "compare_cpu", "lm_base", "lm_large"):
    validate_config(importlib.import_module(f"configs.{name}").get_config())
  config = default.get_config()
  del config["health"]  # a hand-built config without the section gets the defaults
  validate_config(config)
  assert health.GuardSettings.from_settings(from_config(config)).after_step == config.train.warmup_steps


@pytest.mark.parametrize("key,value,message", [
    ("on_collapse", "halt", r"health.on_collapse='halt' is unknown; choose one of \('warn', 'stop'\)"),
    ("patience", 0, "health.patience=0 must be >= 1"),
    ("min_load_balance", 1.5, r"health.min_load_balance=1.5 must lie in \[0, 1\]"),
    ("min_contribution", -0.1, r"health.min_contribution=-0.1 must lie in \[0, 1\]"),
    ("min_mean_gate", 0.05, "health.min_mean_gate is unknown; the health keys are"),
    ("after_step", 900, r"health.after_step=900 must lie in \[-1, train.steps=850\)"),
    ("min_gate", 0.1, "health.min_gate is unknown; the health keys are"),
])
def test_bad_health_settings_name_the_key_and_the_fix(key, value, message):
  config = default.get_config()
  config.health[key] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


# --- the comparison -------------------------------------------------------------------------------------------------

def _record(method, label, seed, health_section):
  summary = RunSummary(valid={"perplexity": 100.0}, test={"perplexity": 110.0}, tokens_per_second=1.0,
                       train_seconds=60.0, distill_agreement_at_boundary=None, health=health_section)
  return {"method": method, "label": label, "seed": seed, "overrides": {}, "summary": summary,
          "curve": [[60.0, 100.0]], "fluctuation": None, "shared_params": 1, "expert_params": 1, "total_params": 2,
          "flops_per_token": 1}


def _health(gate, dead):
  layer = {"mean_gate": gate, "low_gate_fraction": 0.9 if dead else 0.0, "load_balance": 0.8, "max_load": 0.4,
           "dropped_fraction": 0.2, "load_entropy": 1.6, "dead": dead}
  return {"ok": not dead, "dead_layers": ["moe_0"] if dead else [], "layers": {"moe_0": layer},
          "contribution": {"layers": {"moe_0": {"relative_perplexity_increase": 0.0 if dead else 0.05}}}}


def test_comparison_has_health_columns_for_every_method_and_marks_a_dead_layer(tmp_path):
  records = [_record("stablemoe", "StableMoE", 0, _health(0.0001, True)),
             _record("stablemoe", "StableMoE", 1, _health(0.3, False)),
             _record("hash", "Hash Layer", 0, _health(1.0, False)),
             _record("dense", "dense", 0, {"ok": True, "dead_layers": [], "layers": {},
                                           "contribution": {"layers": {}}}),
             _record("old", "an old run", 0, None)]
  config = default.get_config()
  config.compare = ml_collections.ConfigDict({"methods": "stablemoe", "seeds": 2})
  rows = report.write_reports(Comparison.of(config), records, tmp_path)
  stable, hashed, dense, old = rows
  assert stable["health"]["dead"] == [[0, "moe_0"]] and stable["health"]["mean_gate"] == pytest.approx(0.15005)
  assert stable["health"]["contribution"] == pytest.approx(0.025)
  table = (tmp_path / "comparison.md").read_text()
  lines = {}
  for line in table.splitlines():  # the first table's rows (the paired table's rows come after)
    if line.startswith("| "):
      lines.setdefault(line.split(" | ")[0], line)
  assert "DEAD LAYER: moe_0 (seed 0)" in lines["| StableMoE (DEAD LAYER)"]
  assert "| ok | 1.000 | 0.0% | 0.80 | 40.0% | 20.0% | +5.00% |" in lines["| Hash Layer"]
  assert "| no MoE layer | -- | -- | -- | -- | -- | -- |" in lines["| dense"]
  assert "| not recorded |" in lines["| an old run"]
  assert "**DEAD LAYER** (StableMoE)" in table and "not the method's result" in table
  header = table.splitlines()[[i for i, line in enumerate(table.splitlines()) if line.startswith("| method")][0]]
  for column in ("router health", "mean gate", "gates < 0.01", "load balance", "max load", "dropped",
                 "valid PPL increase without the layer"):
    assert f"| {column} |" in header


def test_no_committed_run_whose_layer_is_worth_3_percent_is_dead():
  """Every committed run of the tuned sweep (results/tune_h100), judged as the comparison judges it: none whose
  layer costs >= 3% when removed is dead (the old gate rule flagged 5 such runs), and the 0.0-0.5% layers are."""
  import json, pathlib  # pylint: disable=import-outside-toplevel,multiple-imports
  root = pathlib.Path(__file__).resolve().parents[2] / "results" / "tune_h100"
  judged = []
  for path in sorted(root.glob("*/*/seed*/summary.json")):
    summary = json.loads(path.read_text())
    layers = ((summary.get("health") or {}).get("contribution") or {}).get("layers") or {}
    if layers:
      worth = min(v["relative_perplexity_increase"] for v in layers.values())
      judged.append((worth, health.judge_health(summary.get("health"), read_metrics(path.parent))["ok"]))
  assert len(judged) >= 80
  assert all(alive for worth, alive in judged if worth >= 0.03)
  assert not any(alive for worth, alive in judged if worth < 0.005)


def test_every_committed_summary_stores_the_verdict_the_reports_make():
  """Each committed ``results/**/summary.json`` stores today's verdict (``ok``, ``dead_layers``, ``verdict``): the
  runner's re-judging (what every report reads) leaves it as it is, and by hand a layer is dead exactly when removing
  it costs less than the recorded (else 1%) minimum or the two busiest of its N > 2 experts took more than 90% of
  the tokens in the last logged window; with more than one MoE layer (translation), the model is dead, every layer
  listed, only when all its layers removed at once cost less than the minimum (the runs trained since that measure)
  or every layer is under the line (the only rule for the runs before it), and a layer under it while another works
  is weak."""
  import json, pathlib  # pylint: disable=import-outside-toplevel,multiple-imports
  from stablemoe_jax.compare import runner  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(__file__).resolve().parents[2] / "results"
  paths = sorted(root.rglob("summary.json"))
  assert len(paths) >= 147
  for path in paths:
    summary = RunSummary.load(path)
    stored = summary.health
    assert runner.judged(summary, path.parent).health == stored, path
    minimum = (stored.get("guard") or {}).get("min_contribution", 0.01)
    records = read_metrics(path.parent)
    dead = []
    for layer, worth in stored["contribution"]["layers"].items():
      loads = [r[f"moe/{layer}/load"] for r in records if f"moe/{layer}/load" in r]
      values = stored["layers"][layer]
      load = sorted(loads[-1], reverse=True) if loads else None
      top2 = values.get("top2_load", None if load is None else load[0] + load[1])
      experts = values.get("num_experts", None if load is None else len(load))
      if worth["relative_perplexity_increase"] < minimum or (top2 is not None and experts > 2 and top2 > 0.9):
        dead.append(layer)
    if len(stored["contribution"]["layers"]) > 1:
      # The model is dead when all its MoE layers removed at once cost less than the minimum (runs trained since
      # the measure) or when every layer is under the line (the only rule for the runs before it).
      whole = (stored["contribution"].get("all_layers") or {}).get("relative_perplexity_increase")
      model_dead = len(dead) == len(stored["contribution"]["layers"]) or (whole is not None and whole < minimum)
      below, dead = dead, (sorted(stored["contribution"]["layers"]) if model_dead else [])
      assert stored["weak_layers"] == ([] if dead else sorted(below)), path
    assert stored["dead_layers"] == dead and stored["ok"] is (not dead), path
  # The example: BASE at 4e-3 / 400, seed 1, worth +5.3%, stored "dead" by the old gate rule, alive now.
  base = json.loads((root / "tune_h100" / "base" / "lr0.004_warmup400" / "seed1" / "summary.json").read_text())["health"]
  assert base["ok"] and base["dead_layers"] == [] and base["verdict"]["moe_0"]["contribution"] == pytest.approx(0.0531,
                                                                                                              abs=1e-4)

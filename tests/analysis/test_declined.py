"""Declined tokens (analysis/declined.py, commands/declined.py): the counts by hand (top-1 and top-k), and on tiny
BASE, Hash and DeepSeek (top-2) models against the routing records' functions and the layer's own health metrics."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util
from tests.conftest import share_prepared_ptb, train_tiny_run

from stablemoe_jax.analysis.declined import DeclinedCounts, declined_tokens
from stablemoe_jax.analysis.report import global_inputs
from stablemoe_jax.analysis.routes import analysis_model, make_sample_router
from stablemoe_jax.commands import declined as declined_command
from stablemoe_jax.experiment import loop
from stablemoe_jax.models.routing import ROUTING, STATS, layer_stats


def test_counts_of_a_hand_made_batch():
  counts = DeclinedCounts()
  train = np.array([0, 1, 2, 3, 1, 0])
  inference = np.array([0, 2, 2, 1, 1, 3])  # tokens 1, 3, 5 forced
  gate = np.array([0.5, 0.001, 0.005, 0.002, 0.9, 0.3])
  mask = np.array([True, True, True, True, True, False])  # token 5 is padding
  counts.add(train, gate, inference, mask)
  summary = counts.summary()
  assert summary["tokens"] == 5
  assert summary["forced_fraction"] == pytest.approx(2 / 5)  # tokens 1 and 3
  assert summary["low_gate_fraction"] == pytest.approx(3 / 5)  # tokens 1, 2, 3
  assert summary["forced_share_of_low_gates"] == pytest.approx(2 / 3)
  assert summary["low_gate_fraction_forced"] == 1.0 and summary["low_gate_fraction_own"] == pytest.approx(1 / 3)
  assert summary["mean_gate_forced"] == pytest.approx((0.001 + 0.002) / 2)
  assert summary["mean_gate_own"] == pytest.approx((0.5 + 0.005 + 0.9) / 3)
  assert DeclinedCounts().summary()["forced_fraction"] is None  # nothing counted: no ratio, not a division error


def test_top_k_counts_compare_sets_of_choices_and_read_the_largest_gate():
  counts = DeclinedCounts()
  train = np.array([[0, 1], [2, 3], [1, 0], [3, 2]])
  inference = np.array([[1, 0], [2, 1], [1, 0], [0, 2]])  # token 0: same set in another order (own); 1, 3 forced
  largest_gate = np.array([0.004, 0.6, 0.01, 0.009])  # tokens 0 and 3 declined; exactly LOW_GATE is not
  counts.add(train, largest_gate, inference, np.ones(4, bool))
  summary = counts.summary()
  assert summary["forced_fraction"] == pytest.approx(2 / 4)
  assert summary["low_gate_fraction"] == pytest.approx(2 / 4)
  assert summary["low_gate_fraction_forced"] == pytest.approx(1 / 2)  # token 3 of tokens 1, 3
  assert summary["low_gate_fraction_own"] == pytest.approx(1 / 2)  # token 0 of tokens 0, 2
  assert summary["mean_gate_forced"] == pytest.approx((0.6 + 0.009) / 2)


def test_top_k_tokens_whose_sets_differ_in_one_choice_only_are_forced():
  # k = 3 of 6 experts. Token 0: one of three experts swapped (sorted sets (0, 1, 4) / (0, 1, 5): one position
  # differs); token 1: the same set in another order; token 2: two of three differ; token 3: one differs, and its
  # sorted sets are shifted ((1, 2, 3) / (2, 3, 4): every position differs). Forced: 0, 2, 3; declined: 0 and 1.
  counts = DeclinedCounts()
  train = np.array([[4, 0, 1], [5, 2, 3], [0, 1, 2], [1, 2, 3]])
  inference = np.array([[1, 5, 0], [3, 5, 2], [0, 4, 5], [4, 3, 2]])
  counts.add(train, np.array([0.005, 0.002, 0.4, 0.6]), inference, np.ones(4, bool))
  summary = counts.summary()
  assert summary["forced_fraction"] == pytest.approx(3 / 4)
  assert summary["low_gate_fraction_forced"] == pytest.approx(1 / 3)  # token 0 of tokens 0, 2, 3
  assert summary["low_gate_fraction_own"] == 1.0  # token 1
  assert summary["mean_gate_forced"] == pytest.approx((0.005 + 0.4 + 0.6) / 3)


def _experiment(tiny_config, prepared_ptb, tmp_path, router):
  config = ml_collections.ConfigDict(tiny_config.to_dict())
  config.model.moe.router = router
  if router == "switch_top2_jitter":  # top-2 whose training routing (input noise) differs from inference's
    config.model.moe.router = "switch"
    config.model.moe.switch.top_k, config.model.moe.switch.jitter = 2, 0.5
  share_prepared_ptb(prepared_ptb, tmp_path)
  return loop.Experiment(config, tmp_path)


def _reference(exp, params, batches):
  """Forced share from the routing records' router (every choice, compared as sets); low-gate share and mean gate
  from the layer's sown training metrics (each token's largest gate); the first choice's sown gates; the forced
  tokens whose sorted sets differ in some positions but not all."""
  cfg = exp.config
  model = analysis_model(exp.task, exp.settings.model)
  sample_router = jax.jit(make_sample_router(model, cfg.seed, choices=True), static_argnums=2)
  forced, low, mean_gate, tokens, first_gates, partly = 0.0, 0.0, 0.0, 0, [], 0
  for batch in batches:
    inputs = global_inputs(exp.view(), batch)
    train, inference = sample_router(params, inputs, True)
    _, sown = model.apply({"params": params}, *inputs, jnp.array(True), deterministic=False,
                          rngs={"dropout": jax.random.key(0)}, mutable=[STATS, ROUTING])
    metric = lambda name: getattr(layer_stats(sown)["moe_0"], name)
    first_gates.append(np.asarray(jax.tree_util.tree_leaves(sown[ROUTING]["moe_0"]["gate"])[0]))
    n = int((np.asarray(batch["weights"]) > 0).sum())
    assert n == batch["weights"].size  # full batches: the metric's weighted mean is a plain mean
    train_sets, inference_sets = (np.sort(np.asarray(r["moe_0"]), axis=-1) for r in (train, inference))
    differ = (train_sets != inference_sets).sum(axis=-1)  # positions of the sorted sets that differ
    forced += float((differ > 0).sum())
    partly += int(((differ > 0) & (differ < train_sets.shape[-1])).sum())  # forced, not in every position
    low += float(metric("low_gate_fraction")) * n
    mean_gate += float(metric("mean_gate")) * n
    tokens += n
  return forced / tokens, low / tokens, mean_gate / tokens, np.concatenate(first_gates), partly


def _rank_expert_0_first(params):
  """A DeepSeek model's params with a bias of +1 on expert 0: it is every token's first choice, whatever its
  affinity, so its gate is the smaller of a token's two wherever the other expert's affinity is the larger."""
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict({k: (v.at[0].set(1.0) if k[-1] == "expert_bias" else v)
                                       for k, v in flat.items()})


@pytest.mark.parametrize("router", ["base", "hash", "deepseek", "switch_top2_jitter"])
def test_forced_and_declined_shares_match_independent_routing_and_metrics(tiny_config, prepared_ptb, tmp_path, router):
  exp = _experiment(tiny_config, prepared_ptb, tmp_path, router)
  try:
    params = exp.init_state().params
    if router == "deepseek":
      params = _rank_expert_0_first(params)
    layers = declined_tokens(exp.view(), params, "valid", max_batches=3)
    cfg = ml_collections.ConfigDict(exp.config.to_dict())
    cfg.eval.batch_size, cfg.eval.seq_len = cfg.train.batch_size, cfg.train.seq_len
    batches = [b for _, b in zip(range(3), exp.task.eval_batches(exp.data, cfg, "valid"))]
  finally:
    exp.checkpointer.close()
  assert list(layers) == ["moe_0"]
  summary = layers["moe_0"]
  assert summary["tokens"] == 3 * cfg.train.batch_size * cfg.train.seq_len
  forced, low, mean_gate, first_gates, partly = _reference(exp, params, batches)
  assert summary["forced_fraction"] == pytest.approx(forced)
  assert summary["low_gate_fraction"] == pytest.approx(low, abs=1e-6)
  if router == "hash":  # the same table in training and at inference; gate 1
    assert summary["forced_fraction"] == 0.0 and summary["low_gate_fraction"] == 0.0
  elif router == "deepseek":  # top-2, the same biased ranking in training and at inference: the largest gate's mean
    assert summary["forced_fraction"] == 0.0
    assert (first_gates < 0.5).sum() >= 10  # the first choice's gate is not the largest for these tokens
    assert summary["mean_gate_own"] == pytest.approx(mean_gate, rel=1e-5) and summary["mean_gate_own"] >= 0.5
  elif router == "switch_top2_jitter":  # the noise changes some tokens' sets, some in one sorted position only
    assert 0.0 < summary["forced_fraction"] < 1.0 and partly > 0
  else:  # the balanced assignment moves some tokens off their argmax at initialisation already
    assert 0.0 < summary["forced_fraction"] < 1.0


def test_a_dense_model_is_refused_naming_the_setting(tiny_config, prepared_ptb, tmp_path):
  tiny_config.model.moe.enabled = False
  exp = _experiment(tiny_config, prepared_ptb, tmp_path / "dense", "stablemoe")
  try:
    with pytest.raises(ValueError, match=r"no MoE layer to analyse \(model.moe.enabled is False\)"):
      declined_tokens(exp.view(), exp.init_state().params, "valid", max_batches=1)
  finally:
    exp.checkpointer.close()


def test_command_on_a_trained_run_writes_its_json(tiny_config, prepared_ptb, tmp_path, capsys):
  config = train_tiny_run(tiny_config, prepared_ptb, tmp_path, "base")
  result = declined_command.main([str(tmp_path), "--batches", "2"])
  saved = json.loads((tmp_path / "analysis" / "declined_valid_step4.json").read_text())
  assert saved == json.loads(json.dumps(result)) and saved["step"] == 4
  assert saved["layers"]["moe_0"]["tokens"] == 2 * config.train.batch_size * config.train.seq_len
  assert "moe_0: 128 tokens; forced off the inference expert" in capsys.readouterr().out


def test_command_names_a_folder_that_is_not_a_run(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    declined_command.main([str(tmp_path)])
  assert exit_info.value.code == 2
  assert "config.json not found: RUN_DIR must be the workdir of a training run" in capsys.readouterr().err

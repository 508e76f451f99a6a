"""The balancing bias's share of the routing (analysis/bias_share.py, commands/bias_share.py): the counts by hand, and
on a tiny DeepSeek model against a float64 per-token routing of the router's own inputs."""
from __future__ import annotations

import json

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from tests.conftest import share_prepared_ptb, train_tiny_run

from stablemoe_jax.analysis.bias_share import OverriddenCounts, bias_overridden_tokens
from stablemoe_jax.analysis.report import global_inputs
from stablemoe_jax.analysis.routes import analysis_model
from stablemoe_jax.commands import bias_share as bias_share_command
from stablemoe_jax.experiment import loop
from stablemoe_jax.models.deepseek_router import DeepSeekRouter


def test_counts_of_a_hand_made_batch():
  counts = OverriddenCounts()
  biased = np.array([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]])
  unbiased = np.array([[0, 1], [3, 2], [0, 1], [3, 1], [1, 3]])
  mask = np.array([True, True, True, True, False])  # token 4 is padding
  counts.add(biased, unbiased, mask)
  # token 0 the same; 1 and 2 swap their order (first changed, set the same); 3 keeps its first, not its second
  assert counts.summary() == {"tokens": 4, "first_changed_fraction": 2 / 4, "set_changed_fraction": 1 / 4}
  assert OverriddenCounts().summary()["set_changed_fraction"] is None  # nothing counted: no ratio


def _experiment(tiny_config, prepared_ptb, tmp_path, router="deepseek"):
  config = ml_collections.ConfigDict(tiny_config.to_dict())
  config.model.moe.router = router
  share_prepared_ptb(prepared_ptb, tmp_path)
  return loop.Experiment(config, tmp_path)


def _router_inputs(model, params, inputs) -> np.ndarray:
  """The DeepSeek router's input h [T, d] in the inference routing, caught on its way in."""
  seen = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, DeepSeekRouter) and context.method_name == "__call__":
      seen.append(np.asarray(args[0], np.float64))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    model.apply({"params": params}, *inputs, jnp.array(False), deterministic=True)
  (h,) = seen
  return h.reshape(-1, h.shape[-1])


def _reference(h, centroids, bias, mask, top_k):
  """(first changed, set changed, near ties) among the real tokens, in float64, one token at a time."""
  first = every = near = 0
  for t in np.flatnonzero(mask):
    affinity = 1 / (1 + np.exp(-(centroids @ h[t])))
    with_bias, without = np.argsort(-(affinity + bias)), np.argsort(-affinity)
    first += with_bias[0] != without[0]
    every += set(with_bias[:top_k]) != set(without[:top_k])
    gaps = np.concatenate([np.diff(np.sort(affinity + bias)), np.diff(np.sort(affinity))])
    near += np.min(np.abs(gaps)) < 1e-5  # a float32 forward may rank these two either way
  return first, every, near


def test_shares_match_a_per_token_routing_of_the_routers_inputs(tiny_config, prepared_ptb, tmp_path):
  exp = _experiment(tiny_config, prepared_ptb, tmp_path)
  try:
    params = exp.init_state().params
    assert bias_overridden_tokens(exp.view(), params, "valid", 2)["moe_0"] == {
        "tokens": 2 * 64 * 16, "first_changed_fraction": 0.0, "set_changed_fraction": 0.0, "bias_spread": 0.0,
        "bias": [0.0] * 4}
    split_tokens = sum(int(exp.task.routing_tokens("moe_0", b)[1].sum())
                       for b in exp.task.eval_batches(exp.data, exp.settings, "valid"))
    assert split_tokens > 2 * 64 * 16  # --batches 0: every batch of the split
    assert bias_overridden_tokens(exp.view(), params, "valid", 0)["moe_0"]["tokens"] == split_tokens
    bias = np.array([0.03, -0.02, 0.0, 0.012])  # about the spread of the tiny model's affinities at initialisation
    router = params["moe_0"]["router"]
    params = {**params, "moe_0": {**params["moe_0"], "router": {**router, "expert_bias": jnp.asarray(bias)}}}
    got = bias_overridden_tokens(exp.view(), params, "valid", 2)["moe_0"]
    model = analysis_model(exp.task, exp.settings.model)
    first = every = near = tokens = 0
    for _, batch in zip(range(2), exp.task.eval_batches(exp.data, exp.settings, "valid")):
      h = _router_inputs(model, params, global_inputs(exp.view(), batch))
      mask = np.asarray(exp.task.routing_tokens("moe_0", batch)[1]).reshape(-1)
      counted = _reference(h, np.asarray(router["centroids"], np.float64), bias, mask, top_k=2)
      first, every, near, tokens = first + counted[0], every + counted[1], near + counted[2], tokens + mask.sum()
  finally:
    exp.checkpointer.close()
  assert got["tokens"] == tokens and got["bias_spread"] == pytest.approx(0.05)
  np.testing.assert_allclose(got["bias"], bias, rtol=1e-6)
  assert 0.05 < every / tokens < 0.95 and 0.05 < first / tokens < 0.95  # the bias moves some tokens, not all
  assert abs(got["first_changed_fraction"] * tokens - first) <= near
  assert abs(got["set_changed_fraction"] * tokens - every) <= near


def test_a_run_without_a_bias_is_named(tiny_config, prepared_ptb, tmp_path):
  exp = _experiment(tiny_config, prepared_ptb, tmp_path, router="switch")
  try:
    with pytest.raises(ValueError, match="no MoE layer of this run has a balancing bias"):
      bias_overridden_tokens(exp.view(), exp.init_state().params)
  finally:
    exp.checkpointer.close()


def test_command_on_a_trained_run_writes_its_json_and_names_a_missing_checkpoint(tiny_config, prepared_ptb,
                                                                                   tmp_path, capsys):
  train_tiny_run(tiny_config, prepared_ptb, tmp_path, "deepseek")
  result = bias_share_command.main([str(tmp_path), "--batches", "2"])
  saved = json.loads((tmp_path / "analysis" / "bias_share_valid_step4.json").read_text())
  assert saved == json.loads(json.dumps(result)) and saved["step"] == 4
  layer = saved["layers"]["moe_0"]
  assert layer["tokens"] == 2 * 64 * 16 and layer["bias_spread"] > 0  # 4 bias updates of 1e-3 each
  assert "moe_0: 2048 tokens; the bias changes the first expert of" in capsys.readouterr().out
  earlier = bias_share_command.main([str(tmp_path), "--batches", "2", "--step", "2"])["layers"]["moe_0"]
  assert (tmp_path / "analysis" / "bias_share_valid_step2.json").is_file()
  assert max(map(abs, earlier["bias"])) <= 2e-3 + 1e-7  # two updates of 1e-3 at most, not the latest checkpoint's four
  assert earlier["bias"] != layer["bias"]
  with pytest.raises(SystemExit) as exit_info:
    bias_share_command.main([str(tmp_path), "--step", "3"])
  assert exit_info.value.code == 2
  assert "checkpoint" in capsys.readouterr().err

"""Routers in training on real data: the two-stage routers' distilled router frozen bit for bit after stage 1 (the
centroids still learning), each router's losses by name on a short PTB run, the balanced hash table from the training
counts through a checkpoint and an evaluation. ``test_routers.py`` checks each router against hand-computed values."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment.step import make_train_step
from stablemoe_jax.models import hash_router
from stablemoe_jax.models.hash_router import balanced_hash_table

from tests.conftest import share_prepared_ptb


@pytest.fixture(scope="module")
def shared_workdir(tmp_path_factory, prepared_ptb):
  """One workdir for the runs that save no checkpoint; its data is the session's prepared corpus."""
  workdir = tmp_path_factory.mktemp("routers_data")
  share_prepared_ptb(prepared_ptb, workdir)
  return workdir


def _distilled(params):
  return params["moe_0"]["router"]["distilled_router"]


@pytest.mark.slow
@pytest.mark.parametrize("router", ["switch", "base"])
def test_fixed_routing_freezes_the_distilled_router_bit_for_bit(tiny_config, shared_workdir, router):
  tiny_config.model.moe.router = router
  tiny_config.model.moe[router].fixed_routing = True
  tiny_config.train.steps, tiny_config.train.stage1_steps = 7, 3
  exp = loop.Experiment(tiny_config, shared_workdir)
  state = exp.init_state()
  step_fn = jax.jit(make_train_step(exp.model, exp.tx, exp.settings, exp.task))
  batches = exp.data.train_iterator(4, 16, seed=0)
  history, metrics = [jax.device_get(state.params)], []
  for _ in range(7):
    state, m = step_fn(state, next(batches))
    history.append(jax.device_get(state.params))
    metrics.append(jax.device_get(m))
  assert [int(m["stage"]) for m in metrics] == [1, 1, 1, 2, 2, 2, 2]
  assert not np.array_equal(_distilled(history[2])["embedding"], _distilled(history[3])["embedding"])
  for later in history[4:]:
    jax.tree.map(np.testing.assert_array_equal, _distilled(history[3]), _distilled(later))
  for before, after in zip(history[3:-1], history[4:]):
    assert not np.array_equal(before["moe_0"]["router"]["centroids"], after["moe_0"]["router"]["centroids"])
  # Stage 1 logs the router's own loss and the distillation loss under their names; stage 2 turns them off.
  assert metrics[0]["aux/distill"] > 0 and all(m["aux/distill"] == 0 for m in metrics[3:])
  if router == "switch":
    assert metrics[0]["aux/balance"] > 0 and all(m["aux/balance"] == 0 for m in metrics[3:])


SMOKE = [("stablemoe", {}), ("switch", {"switch.z_loss_weight": 1e-3, "switch.jitter": 0.01}), ("base", {}),
         ("hash", {"hash.table": "balanced"}), ("stablemoe", {"distilled_router.kind": "transformer"})]


@pytest.mark.slow
@pytest.mark.parametrize("router, settings", SMOKE)
def test_each_router_trains_on_real_data(tiny_config, shared_workdir, router, settings):
  tiny_config.model.moe.router = router
  for key, value in settings.items():
    section, name = key.split(".")
    tiny_config.model.moe[section][name] = value
  tiny_config.train.steps, tiny_config.train.stage1_steps, tiny_config.train.learning_rate = 20, 8, 1e-2
  exp = loop.Experiment(tiny_config, shared_workdir)
  state = exp.init_state()
  initial = jax.device_get(state.params)
  step_fn = jax.jit(make_train_step(exp.model, exp.tx, exp.settings, exp.task))
  batches = exp.data.train_iterator(4, 16, seed=0)
  losses = []
  for _ in range(20):
    state, metrics = step_fn(state, next(batches))
    losses.append(float(metrics["task_loss"]))
  assert np.all(np.isfinite(losses)) and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
  if router == "hash":  # the balanced table came from the training counts and never moves
    table = initial["moe_0"]["router"]["table"]
    counts = exp.train_token_counts()
    np.testing.assert_array_equal(table, balanced_hash_table(counts, 4, seed=0))
    np.testing.assert_array_equal(jax.device_get(state.params)["moe_0"]["router"]["table"], table)
    assert not np.array_equal(table, hash_router.random_hash_table(len(counts), 4, 0))
  if router == "switch":
    assert "aux/z_loss" in metrics and "aux/balance" in metrics
  assert float(exp.evaluate(state.params, "valid", max_batches=1)["perplexity"]) < 3000


@pytest.mark.slow
def test_balanced_hash_table_survives_checkpoint_and_evaluation(tiny_config, prepared_ptb, tmp_path):
  share_prepared_ptb(prepared_ptb, tmp_path)
  tiny_config.model.moe.router, tiny_config.model.moe.hash.table = "hash", "balanced"
  tiny_config.train.steps, tiny_config.train.stage1_steps, tiny_config.train.eval_every = 4, 2, 100
  summary = loop.train_and_evaluate(tiny_config, tmp_path)
  result = loop.evaluate_checkpoint(tiny_config, tmp_path, split="test")
  assert result["perplexity"] == summary.test["perplexity"]

"""Sharded and accumulated runs against the single-device, single-batch run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from tests.conftest import MAIN, REPO, share_prepared_ptb, tiny_flags, xla_flags

from stablemoe_jax.core.settings import from_config
from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment.step import make_train_step

TRAIN_TINY = """
import json, sys
sys.path.insert(0, {repo!r})
from tests.conftest import make_tiny_config
from stablemoe_jax.experiment import loop
config = make_tiny_config({data!r})
config.train.steps, config.train.stage1_steps, config.train.checkpoint_every = 8, 4, 8
config.model.moe.num_groups = 2  # the same routing groups on 1 and 2 devices (2 devices need a multiple of 2)
print("SUMMARY" + json.dumps(loop.train_and_evaluate(config, {workdir!r}).to_json()))
"""


def run_tiny(ptb_dir, workdir, devices):
  env = {**os.environ, "XLA_FLAGS": xla_flags(devices), "JAX_PLATFORMS": "cpu"}
  code = TRAIN_TINY.format(repo=str(REPO), data=str(ptb_dir), workdir=str(workdir))
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.split("SUMMARY")[-1])


@pytest.mark.slow
def test_two_device_data_parallel_run_matches_one_device(ptb_dir, prepared_ptb, tmp_path):
  share_prepared_ptb(prepared_ptb, tmp_path / "one", tmp_path / "two")
  one = run_tiny(ptb_dir, tmp_path / "one", devices=1)
  two = run_tiny(ptb_dir, tmp_path / "two", devices=2)
  for split in ("valid", "test"):
    assert two[split]["tokens"] == one[split]["tokens"]
    assert two[split]["loss"] == pytest.approx(one[split]["loss"], rel=1e-4)


@pytest.mark.slow
def test_two_process_launch_with_experts_across_processes_matches_one_device(ptb_dir, prepared_ptb, tmp_path):
  """launch/local_multiprocess.sh, 2 processes x 2 CPU devices, mesh.expert=4: one expert per device, so the
  all-to-alls carry tokens between the processes. Its run must end where one process on one device does (the same
  4 routing groups, capacity 1.0 and no dropout, so both drop the same tokens), with the checkpoints both wrote."""
  share_prepared_ptb(prepared_ptb, tmp_path / "single", tmp_path / "multi")
  tiny = [*tiny_flags(steps=8, stage1_steps=4, warmup_steps=2, log_every=2, checkpoint_every=4),
          "--config.model.moe.num_groups=4", "--config.model.moe.capacity_factor=1.0", "--config.model.dropout=0.0"]
  env = {**os.environ, "STABLEMOE_DATA_DIR": str(ptb_dir), "JAX_PLATFORMS": "cpu"}
  single = subprocess.run([*MAIN, "--workdir", str(tmp_path / "single"), *tiny], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-3000:]
  multi = subprocess.run(["bash", "launch/local_multiprocess.sh", "2", "2", "--config", "configs/default.py",
                          "--workdir", str(tmp_path / "multi"), *tiny, "--config.mesh.expert=4"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
  assert multi.returncode == 0, multi.stderr[-3000:]
  devices = "CpuDevice(id=0), CpuDevice(id=1), CpuDevice(id=2048), CpuDevice(id=2049)"
  assert f"2 process(es), devices: [{devices}]" in multi.stdout, multi.stdout[-3000:]
  read = lambda d: json.loads((tmp_path / d / "summary.json").read_text())
  for split in ("valid", "test"):
    assert read("multi")[split]["tokens"] == read("single")[split]["tokens"]
    assert read("multi")[split]["loss"] == pytest.approx(read("single")[split]["loss"], rel=1e-4)
  assert sorted(p.name for p in (tmp_path / "multi" / "checkpoints").iterdir() if p.name.isdigit()) == ["4", "8"]


@pytest.mark.slow
def test_microbatch_accumulation_matches_one_batch(tiny_config, prepared_ptb, tmp_path):
  share_prepared_ptb(prepared_ptb, tmp_path)
  # Without dropout, balance loss or dropped tokens a step's result cannot depend on how the batch is split.
  tiny_config.model.dropout = 0.0
  tiny_config.model.moe.stablemoe.balance_alpha = 0.0
  tiny_config.model.moe.capacity_factor = 4.0
  tiny_config.train.warmup_steps = 0  # the first update moves the parameters
  exp = loop.Experiment(tiny_config, tmp_path)
  batch = next(exp.train_batches())
  whole = jax.jit(make_train_step(exp.model, exp.tx, exp.settings, exp.task))(exp.init_state(), batch)
  tiny_config.train.microbatches = 2
  split = jax.jit(make_train_step(exp.model, exp.tx, from_config(tiny_config), exp.task))(exp.init_state(), batch)
  initial = jax.tree.leaves(exp.init_state().params)
  for a, b, a0 in zip(jax.tree.leaves(whole[0].params), jax.tree.leaves(split[0].params), initial):
    # Adam's first update is about +-lr (3e-3) per element whatever the gradient's size, so a tiny
    # rounding difference in a near-zero gradient can move an element by ~1e-5; a wrong gradient by ~3e-3.
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
  assert any(not np.array_equal(a, a0) for a, a0 in zip(jax.tree.leaves(whole[0].params), initial))
  assert float(split[1]["task_loss"]) == pytest.approx(float(whole[1]["task_loss"]), rel=1e-5)
  assert float(split[1]["grad_norm"]) == pytest.approx(float(whole[1]["grad_norm"]), rel=1e-5)


@pytest.mark.slow
def test_microbatches_route_and_balance_per_microbatch(tiny_config, prepared_ptb, tmp_path):
  """With the balance loss on and tokens dropped, each microbatch routes, fills its capacity and takes its balance
  loss on its own rows. Reference: the one-batch step (microbatches=1) run on each microbatch's rows (m, m + M, ...)
  alone; the accumulated gradient is their mean, the logged losses and loads their means. SGD with learning rate 1
  makes the gradient readable from the update."""
  share_prepared_ptb(prepared_ptb, tmp_path)
  import optax
  tiny_config.model.dropout = 0.0
  tiny_config.model.moe.shuffle_tokens = False  # no rng in routing: the reference's step keys do not matter
  tiny_config.model.moe.capacity_factor = 1.0  # 4 slots an expert per 16-token microbatch: tokens drop
  tiny_config.model.moe.stablemoe.balance_alpha = 0.3
  exp = loop.Experiment(tiny_config, tmp_path)
  batch = next(exp.train_batches())
  state = exp.init_state()
  leaves, treedef = jax.tree.flatten(state.params)  # perturbed, so the zero-initialised experts matter
  keys = jax.random.split(jax.random.key(3), len(leaves))
  params = jax.tree.unflatten(treedef, [p + 0.1 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)])
  sgd = optax.sgd(1.0)
  state = state.replace(params=params, opt_state=sgd.init(params))

  def gradient_and_metrics(config, rows):
    new_state, metrics = jax.jit(make_train_step(exp.model, sgd, from_config(config), exp.task))(state, rows)
    grads = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), params, new_state.params)
    return grads, jax.device_get(metrics)

  whole_grads, _ = gradient_and_metrics(tiny_config, batch)
  parts = [gradient_and_metrics(tiny_config, jax.tree.map(lambda x: x[m::2], batch)) for m in range(2)]
  micro = tiny_config.copy_and_resolve_references()
  micro.train.microbatches = 2
  got_grads, got = gradient_and_metrics(micro, batch)
  want_grads = jax.tree.map(lambda a, b: (a + b) / 2, parts[0][0], parts[1][0])
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-6), got_grads, want_grads)
  for name in ("task_loss", "aux/balance", "aux/distill", "moe/moe_0/load", "moe/moe_0/dropped_fraction"):
    np.testing.assert_allclose(got[name], (parts[0][1][name] + parts[1][1][name]) / 2, rtol=1e-5, err_msg=name)
  assert min(parts[0][1]["moe/moe_0/dropped_fraction"], parts[1][1]["moe/moe_0/dropped_fraction"]) > 0
  assert got["aux/balance"] != 0
  # ... and per-microbatch routing matters here: the one-batch gradient differs.
  assert any(not np.allclose(a, b, rtol=1e-3, atol=1e-6)
             for a, b in zip(jax.tree.leaves(whole_grads), jax.tree.leaves(want_grads)))

"""Expert parallelism against one device: layouts, collectives, capacity, shuffle, checkpoints.

Experts across several processes: tests/parallel/test_parallel.py (the launch script).

Layout runs start subprocesses with fake CPU devices (XLA_FLAGS), since this process has one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from tests.conftest import MAIN, REPO, make_tiny_config, share_prepared_ptb, xla_flags

from stablemoe_jax.core.settings import MoESettings, typed
from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.experiment.step import step_rngs
from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.parallel.mesh import check_layout

LAYOUTS = ("expert4", "data2_expert2")  # compared with "one_device"


def run_python(args: list[str], devices: int, timeout: int = 600, env_extra: dict | None = None):
  env = {**os.environ, "XLA_FLAGS": xla_flags(devices), "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": str(REPO), **(env_extra or {})}
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
  out = tmp_path_factory.mktemp("layouts")
  result = run_python(["tests/parallel/ep_layouts_script.py", str(out)], devices=4, timeout=1500)
  assert result.returncode == 0, result.stderr[-3000:]
  return np.load(out / "layouts.npz"), json.loads((out / "summary.json").read_text())


def _compare(arrays, prefix: str, rtol: float, atol: float) -> int:
  names = [k[len("one_device/"):] for k in arrays.files if k.startswith(f"one_device/{prefix}")]
  for name in names:
    for layout in LAYOUTS:
      np.testing.assert_allclose(arrays[f"{layout}/{name}"], arrays[f"one_device/{name}"], rtol=rtol, atol=atol,
                                 err_msg=f"{layout}: {name}")
  return len(names)


@pytest.mark.slow
def test_forward_gradients_and_three_steps_match_one_device(layouts):
  arrays, _ = layouts
  assert _compare(arrays, "logits", rtol=1e-5, atol=1e-5) == 1
  assert _compare(arrays, "grad", rtol=1e-5, atol=1e-6) > 20  # every parameter's gradient
  # Adam's early updates are about +-lr whatever the gradient's size: tiny rounding differences move ~1e-5.
  assert _compare(arrays, "params", rtol=1e-4, atol=2e-4) > 20
  # Balance loss, per-expert loads and dropped fractions of every MoE layer, at every one of the three steps.
  assert _compare(arrays, "metrics", rtol=1e-5, atol=1e-6) >= 3 * (4 + 2 * 3)
  # What each MoE layer sows: balance and distillation losses; load, dropped fraction, load entropy, mean gate,
  # low-gate fraction, load balance, max load (router health); distillation loss and accuracy, centroid disagreement;
  # the cosine router's temperature (the default's routing).
  assert _compare(arrays, "sown", rtol=1e-5, atol=1e-7) == 13 * 3
  assert any(k.endswith("router_temperature") for k in arrays.files)
  for name in [k for k in arrays.files if k.startswith("one_device/") and ("load" in k or "dropped" in k)]:
    for layout in LAYOUTS:  # counts of tokens: exactly equal
      np.testing.assert_array_equal(arrays[name.replace("one_device/", f"{layout}/")], arrays[name], err_msg=name)
  dropped = [float(arrays[f"one_device/metrics/{i}/moe/moe_{k}/dropped_fraction"]) for i in range(3) for k in range(3)]
  assert min(dropped) > 0.05  # capacity is small enough that tokens drop
  assert float(arrays["one_device/metrics/0/aux/balance"]) > 0


@pytest.mark.slow
def test_expert_parallel_step_has_two_all_to_alls_per_moe_layer_and_no_weight_gather(layouts):
  _, summary = layouts
  for layout in LAYOUTS:
    hlo = summary[f"{layout}/hlo"]
    assert hlo["eval_all_to_all"] == 2 * 3  # forward: 3 MoE layers, one each way
    assert hlo["train_all_to_all"] == 4 * 3  # forward and backward
    assert hlo["train_all_gather"] == 0, hlo["all_gathered_shapes"]
    assert not hlo["token_expert_capacity_shape"]
    assert summary[f"{layout}/expert_grad_specs"] == ["P('expert',)"]  # expert gradients come back sharded
    assert summary[f"{layout}/batch_spec"] == "P(('data', 'expert'),)"
  assert summary["one_device/hlo"]["train_all_to_all"] == 0


@pytest.fixture(scope="module")
def dispatcher_summary(tmp_path_factory):
  out = tmp_path_factory.mktemp("dispatcher")
  result = run_python(["tests/parallel/ep_layouts_script.py", str(out), "dispatcher"], devices=4, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  return {**summary["dispatcher"], "topk": summary["topk"]}


@pytest.mark.parametrize("mesh", ["expert4", "data2_expert2"])
def test_all_to_all_capacity_per_group_and_token_order(dispatcher_summary, mesh):
  # 8 experts, 8 groups of 12 tokens (2 a device), C = 2, on a 1 x 4 and a 2 x 2 (data x expert) mesh. A marker
  # expert returns 10 * row + (expert + 1) + 100 * (global group + 1); the reference is that formula in numpy for
  # the first C tokens of each (group, expert), 0 for the others, so a wrong expert, group or place shows.
  for routing in ("random", "all_to_expert0"):
    result = dispatcher_summary[f"{mesh}/{routing}"]
    assert result["a2a_vs_reference"] < 1e-4 and result["index_vs_reference"] < 1e-4, result
  assert dispatcher_summary[f"{mesh}/all_to_expert0"]["kept_per_group"] == [2] * 8
  assert dispatcher_summary[f"{mesh}/all_to_expert0"]["kept_are_first_c"]


@pytest.mark.parametrize("mesh", ["expert4", "data2_expert2"])
def test_top2_layer_with_a_shared_expert_matches_one_device(dispatcher_summary, mesh):
  # Switch top-2 (each choice its own capacity slot; cf 0.75 drops some) plus one shared expert, through the
  # all-to-all dispatcher on 4 devices: the same output and gradients as the index dispatcher on one.
  result = dispatcher_summary["topk"]
  assert result[mesh]["out_diff"] < 1e-5 and result[mesh]["grad_diff"] < 1e-5, result[mesh]
  assert result[mesh]["dropped"] == result["one_device"]["dropped"] > 0
  assert result[mesh]["grads"] >= 12  # router centroids, routed and shared experts' six leaves each
  assert result[mesh]["all_to_all"] == 2 and result["one_device"]["all_to_all"] == 0  # one each way


@pytest.mark.slow
def test_expert_dropout_does_not_depend_on_the_layout(layouts):
  _, summary = layouts
  assert summary["dropout"]["dropout_changes_output"] > 1e-2
  assert summary["dropout"]["max_diff_across_layouts"] < 1e-5


def test_token_shuffle_drops_random_tokens_but_exactly_capacity_per_group():
  groups, group_size, experts, capacity = 3, 16, 4, 5
  index = jnp.zeros((groups, group_size), jnp.int32)  # every token wants expert 0
  kept_sets = []
  for step in range(3):
    slots = capacity_lib.group_slots(index, experts, capacity, jax.random.fold_in(jax.random.key(0), step))
    kept = np.asarray(slots < experts * capacity)
    np.testing.assert_array_equal(kept.sum(axis=1), [capacity] * groups)
    assert sorted(np.asarray(slots)[kept].reshape(groups, capacity)[0].tolist()) == list(range(capacity))
    kept_sets.append(kept)
  assert not np.array_equal(kept_sets[0], kept_sets[1]) and not np.array_equal(kept_sets[1], kept_sets[2])
  again = capacity_lib.group_slots(index, experts, capacity, jax.random.fold_in(jax.random.key(0), 0))
  np.testing.assert_array_equal(np.asarray(again) < experts * capacity, kept_sets[0])  # same seed and step
  unshuffled = np.asarray(capacity_lib.group_slots(index, experts, capacity)) < experts * capacity
  assert np.all(unshuffled[:, :capacity]) and not np.any(unshuffled[:, capacity:])


@pytest.mark.slow
def test_train_step_shuffles_only_in_training(tiny_config, tmp_path):
  from stablemoe_jax.models.moe import make_moe_layer
  moe = ml_collections.ConfigDict(tiny_config.model.moe.to_dict())
  moe.capacity_factor, moe.num_groups, moe.eval_capacity_factor = 0.5, 2, 0.5
  layer = make_moe_layer(typed(MoESettings, moe), 20, 1, 16)
  x = jax.random.normal(jax.random.key(0), (2, 16, 8))
  ids = jnp.zeros((2, 16), jnp.int32)
  params = nn.unbox(layer.init(jax.random.key(1), x, ids, jnp.array(True))["params"])
  leaves, treedef = jax.tree.flatten(params)  # non-zero output projections, so served tokens change
  params = jax.tree.unflatten(treedef, [p + 0.3 * jax.random.normal(jax.random.key(i), p.shape)
                                        for i, p in enumerate(leaves)])
  a = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False, rngs=step_rngs(jax.random.key(1)))
  b = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False, rngs=step_rngs(jax.random.key(2)))
  c = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False, rngs=step_rngs(jax.random.key(1)))
  passed = lambda out: np.all(np.asarray(out) == np.asarray(x), axis=-1)  # dropped tokens pass unchanged
  assert not np.array_equal(passed(a), passed(b)) and np.array_equal(passed(a), passed(c))
  assert passed(a).sum() == passed(b).sum()  # same loads, same number dropped
  e1 = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=True, rngs=step_rngs(jax.random.key(1)))
  e2 = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=True, rngs=step_rngs(jax.random.key(2)))
  np.testing.assert_array_equal(e1, e2)  # evaluation: no shuffle


@pytest.mark.parametrize("key, value, devices, message", [
    ("mesh.expert", 3, 8, "mesh.expert=3 must divide model.moe.num_experts=4"),
    ("mesh.expert", 4, 6, "mesh.expert=4 must divide the number of devices (6)"),
    ("model.moe.num_groups", 2, 4, "model.moe.num_groups=2 must be a multiple of the 4 devices"),
    ("train.batch_size", 6, 4,
     "train.batch_size / train.microbatches=6 must be a multiple of the number of devices (4)"),
    ("model.moe.num_groups", 5, 1, "model.moe.num_groups=5 must divide the 64 tokens of a train batch"),
])
def test_bad_layout_is_one_clear_config_error(tiny_config, key, value, devices, message):
  tiny_config.model.moe.num_groups = 8
  section, _, name = key.rpartition(".")
  target = tiny_config
  for part in section.split("."):
    target = target[part]
  target[name] = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    validate_config(tiny_config)
    check_layout(tiny_config, devices)


def test_group_count_not_fitting_the_devices_exits_2_before_compiling(tmp_path, ptb_dir):
  result = run_python(["-m", "stablemoe_jax.main", "--config", "configs/default.py", "--workdir", str(tmp_path),
                       "--config.model.moe.num_groups=2", "--config.mesh.expert=4"], devices=4, timeout=300,
                      env_extra={"STABLEMOE_DATA_DIR": str(ptb_dir)})
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "error: model.moe.num_groups=2 must be a multiple of the 4 devices that split the tokens (mesh data x expert); "
      "set --config.model.moe.num_groups to a multiple of 4 (it changes the routing, so keep it fixed across layouts).")
  assert not (tmp_path / "checkpoints").exists()


RESHARD = """
import json, shutil, sys
sys.path.insert(0, {repo!r})
from tests.conftest import make_tiny_config
from stablemoe_jax.experiment import loop
def config(expert):
  c = make_tiny_config({data!r})
  c.model.dropout = 0.0
  c.model.moe.capacity_factor, c.model.moe.num_groups, c.mesh.expert = 1.0, 4, expert
  c.train.steps, c.train.stage1_steps, c.train.checkpoint_every = 8, 4, 4
  return c
out = {{"uninterrupted": loop.train_and_evaluate(config(4), {workdir!r} + "/whole").to_json()}}
loop.train_and_evaluate(config(4), {workdir!r} + "/split", stop_at_step=6)  # killed after the step-4 checkpoint
out["resumed_on_data2_expert2"] = loop.train_and_evaluate(config(2), {workdir!r} + "/split").to_json()
print("SUMMARY" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def resharded_runs(tmp_path_factory, ptb_dir, prepared_ptb):
  """1 process x 4 devices: an uninterrupted mesh.expert=4 run; one stopped after step 6, resumed as 2 x 2."""
  workdir = tmp_path_factory.mktemp("reshard")
  share_prepared_ptb(prepared_ptb, workdir / "whole", workdir / "split")
  code = RESHARD.format(repo=str(REPO), data=str(ptb_dir), workdir=str(workdir))
  result = run_python(["-c", code], devices=4)
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir, json.loads(result.stdout.split("SUMMARY")[-1])


@pytest.mark.slow
def test_checkpoint_of_expert4_resumes_as_data2_expert2_and_evaluates_on_one_device(resharded_runs, tiny_config):
  workdir, runs = resharded_runs
  whole, resumed = runs["uninterrupted"], runs["resumed_on_data2_expert2"]
  for split in ("valid", "test"):
    assert resumed[split]["tokens"] == whole[split]["tokens"]
    assert resumed[split]["loss"] == pytest.approx(whole[split]["loss"], rel=1e-5)
  # This process has one device: the 4-way sharded checkpoint restores here and evaluates the same.
  tiny_config.model.dropout = 0.0
  tiny_config.model.moe.capacity_factor, tiny_config.model.moe.num_groups = 1.0, 4
  tiny_config.train.steps, tiny_config.train.stage1_steps, tiny_config.train.checkpoint_every = 8, 4, 4
  assert jax.device_count() == 1 and tiny_config.mesh.expert == 1
  one = loop.evaluate_checkpoint(tiny_config, workdir / "whole", step=8, split="valid")
  assert one["loss"] == pytest.approx(whole["valid"]["loss"], rel=1e-5)
  # Each device's shard was written as its own chunk, not gathered into one array first.
  import tensorstore as ts
  state_dir = f"file://{workdir}/whole/checkpoints/8/state"
  w_in = ts.open({"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": state_dir,
                                                 "path": "params.moe_0.experts.w_in"}}).result()
  assert w_in.shape[0] == 4 and w_in.chunk_layout.write_chunk.shape[0] == 1


def test_shardings_come_from_the_rules_table():
  from jax.sharding import PartitionSpec as P
  from stablemoe_jax.parallel import mesh as mesh_lib
  from stablemoe_jax.parallel import sharding as sharding_lib
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict({"expert": 1}))
  assert sharding_lib.batch_sharding(mesh).spec == P(("data", "expert"))
  boxed = {"w": nn.LogicallyPartitioned(jnp.zeros((4, 2)), (sharding_lib.EXPERTS, None)), "b": jnp.zeros(3)}
  specs = jax.tree.map(lambda s: s.spec, sharding_lib.state_shardings(boxed, mesh))
  assert specs == {"w": P("expert", None), "b": P()}

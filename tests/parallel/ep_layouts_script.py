"""Run by tests/parallel/test_expert_parallel.py in a subprocess with 4 (or more) CPU devices.

Computes, for one tiny model and one batch, on three layouts of the same devices (1 device;
mesh.expert=4; data 2 x expert 2; all with G = 4 routing groups): the train-mode forward, every
gradient leaf, three train steps and their metrics, the compiled HLO's collectives and the expert dropout
across layouts. Writes everything to ``OUT/layouts.npz`` and ``OUT/summary.json`` for the test to compare.
``ep_layouts_script.py OUT dispatcher`` runs only the dispatcher-level capacity and token-order checks and the top-2
layer with a shared expert across layouts (seconds).
"""
from __future__ import annotations

import functools
import itertools
import json
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from configs import default
from stablemoe_jax.experiment.step import make_eval_step, make_train_step, step_rngs, token_nll
from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.models import dispatch
from stablemoe_jax.models.routing import STATS, layer_stats
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.parallel import sharding as sharding_lib
from stablemoe_jax.tasks.lm import LanguageModelTask
from stablemoe_jax.train.optimizer import make_optimizer
from stablemoe_jax.train.state import create_train_state, train_state_shardings
from stablemoe_jax.core.settings import MoESettings, from_config, typed

LAYOUTS = {"one_device": (1, 1), "expert4": (4, 4), "data2_expert2": (4, 2)}  # name -> (devices, mesh.expert)
EXPERTS, GROUPS, MOE_LAYERS = 8, 4, 3


def tiny_config(expert: int):
  config = default.get_config()
  model = config.model
  model.vocab_size, model.d_model, model.num_heads, model.num_layers, model.d_ff, model.max_len = 50, 32, 2, 2, 64, 16
  model.dropout = 0.0
  moe = model.moe
  moe.num_experts, moe.sublayers_per_expert, moe.placement = EXPERTS, 3, "scattered"  # 3 MoE layers of 1 sublayer
  moe.capacity_factor, moe.num_groups, moe.distilled_router.dim = 1.0, GROUPS, 8  # C = 4 of 32 tokens a group
  config.train.steps, config.train.stage1_steps, config.train.warmup_steps = 3, 2, 1  # step 3 is stage 2
  config.train.batch_size, config.train.seq_len, config.train.learning_rate = 8, 16, 3e-3
  config.mesh.expert = expert
  return config


def flat(tree) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def count(pattern: str, hlo: str) -> int:
  return len(re.findall(pattern, hlo))


def run_layout(name: str, devices: int, expert: int, batch: dict, arrays: dict, summary: dict) -> None:
  config = tiny_config(expert)
  mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:devices])
  model, tx = TransformerLM(from_config(config).model), make_optimizer(from_config(config).train)
  shardings = train_state_shardings(model, tx, config.train.seq_len, mesh)
  state = create_train_state(model, tx, config.seed, config.train.seq_len, mesh, shardings=shardings)
  batch = jax.device_put(batch, sharding_lib.batch_sharding(mesh))
  summary[f"{name}/batch_spec"] = str(batch["inputs"].sharding.spec)

  def loss_and_outputs(params):
    output, sown = model.apply({"params": params}, batch["inputs"], jnp.array(True), deterministic=False,
                               rngs=step_rngs(jax.random.key(5)), mutable=[STATS])
    logits = output.logits()
    aux = sum(jax.tree.leaves([stats.losses for stats in layer_stats(sown).values()]))
    return jnp.mean(token_nll(logits, batch["targets"])) + aux, (logits, sown)

  grads, (logits, sown) = mesh_lib.under_mesh(mesh, jax.jit(jax.grad(loss_and_outputs, has_aux=True)))(state.params)
  arrays.update({f"{name}/logits": np.asarray(logits)})
  arrays.update({f"{name}/grad{k}": v for k, v in flat(grads).items()})
  arrays.update({f"{name}/sown{k}": v for k, v in flat(sown).items()})
  summary[f"{name}/expert_grad_specs"] = sorted({str(g.sharding.spec) for k, g in
                                                 jax.tree_util.tree_leaves_with_path(grads)
                                                 if "experts" in jax.tree_util.keystr(k)})

  batch_sharding = sharding_lib.batch_sharding(mesh)
  replicated = sharding_lib.replicated(mesh)
  step = jax.jit(make_train_step(model, tx, from_config(config), LanguageModelTask()),
                 in_shardings=(shardings, batch_sharding),
                 out_shardings=(shardings, replicated))
  eval_step = jax.jit(make_eval_step(model, LanguageModelTask()), in_shardings=(shardings.params, batch_sharding),
                      out_shardings=replicated)
  with jax.set_mesh(mesh):
    compiled_step = step.lower(state, batch).compile()
    train_hlo = compiled_step.as_text()
    # The eval step's all-to-alls are counted on the expert-parallel layouts; one device has none to count.
    eval_hlo = eval_step.lower(state.params, batch).compile().as_text() if devices > 1 else ""
  summary[f"{name}/hlo"] = {
      "train_all_to_all": count(r" all-to-all\(", train_hlo), "eval_all_to_all": count(r" all-to-all\(", eval_hlo),
      "train_all_gather": count(r" all-gather(-start)?\(", train_hlo),
      "all_gathered_shapes": sorted(set(re.findall(r"= (\S+) all-gather(?:-start)?\(", train_hlo))),
      # a [tokens, experts, capacity] tensor (GShard's one-hot dispatch), per group: [.., 32, 8, 4]
      "token_expert_capacity_shape": bool(re.search(rf"\b32,{EXPERTS},4\]", train_hlo)),
  }
  metrics = []
  for _ in range(3):
    state, m = compiled_step(state, batch)
    metrics.append(m)
  arrays.update({f"{name}/params{k}": v for k, v in flat(state.params).items()})
  arrays.update({f"{name}/metrics/{i}/{k}": np.asarray(v) for i, m in enumerate(metrics) for k, v in m.items()})


def dispatcher_checks(summary: dict) -> None:
  """all_to_all vs index on a marker expert function: which expert served each token, and in what order, on a
  1 x 4 mesh (2 experts a device) and a 2 x 2 one (data 2: the global group of a row depends on the data index),
  2 groups a device on both."""
  groups, group_size, capacity, d = 8, 12, 2, 3
  x = jax.random.normal(jax.random.key(0), (groups, group_size, d))
  marker_params = {"id": jnp.arange(EXPERTS, dtype=jnp.float32)[:, None]}  # [E, 1]: each expert knows its id

  def marker_expert(params, buffers, expert_ids, group_ids, rng):
    # 10 * row + (own id + 1) + 100 * (global group + 1): a wrong expert, group or row shows up in the output.
    ids_from_params = params["id"][:, 0]
    return (10 * buffers + (ids_from_params + 1)[:, None, None, None]
            + 100 * (group_ids + 1)[None, :, None, None].astype(buffers.dtype))

  results = {}
  for (mesh_name, shape), routing in itertools.product(
      {"expert4": (1, 4), "data2_expert2": (2, 2)}.items(), ("random", "all_to_expert0")):
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:4]).reshape(shape), sharding_lib.MESH_AXES)
    if routing == "random":
      index = jax.random.randint(jax.random.key(1), (groups, group_size), 0, EXPERTS)
    else:
      index = jnp.zeros((groups, group_size), jnp.int32)
    slots = capacity_lib.group_slots(index, EXPERTS, capacity)
    kw = dict(expert_fn=marker_expert, num_experts=EXPERTS, capacity=capacity)
    with jax.set_mesh(mesh):
      a2a = jax.jit(lambda x, s: dispatch.all_to_all_dispatch(x, s, marker_params, None, **kw))(x, slots)
    ref = dispatch.index_dispatch(x, slots, marker_params, None, **kw)
    kept = np.asarray(slots < EXPERTS * capacity)
    want = np.where(kept[..., None], 10 * np.asarray(x) + (np.asarray(index) + 1)[..., None]
                    + 100 * (np.arange(groups) + 1)[:, None, None], 0.0)
    results[f"{mesh_name}/{routing}"] = {
        "a2a_vs_reference": float(np.abs(np.asarray(a2a) - want).max()),
        "index_vs_reference": float(np.abs(np.asarray(ref) - want).max()),
        "kept_per_group": kept.sum(axis=1).tolist(),
        "kept_are_first_c": bool(np.all(kept[:, :capacity])) and not bool(np.any(kept[:, capacity:])),
    }
  summary["dispatcher"] = results


def topk_checks(summary: dict) -> None:
  """One MoE layer routing each token to 2 experts (switch top_k=2, capacity counting choices, so some drop) with a
  shared expert, G = 4: its output and every parameter's gradient on 1 device, expert 4 and 2 x 2 (all_to_all)."""
  import flax.linen as nn
  import ml_collections
  from stablemoe_jax.models.moe import MeshFacts, make_moe_layer
  moe = tiny_config(1).model.moe
  moe.router, moe.switch.top_k, moe.shared_experts, moe.capacity_factor = "switch", 2, 1, 0.75
  moe.num_groups, moe.shuffle_tokens = GROUPS, False
  x = jax.random.normal(jax.random.key(0), (4, 8, 8))
  ids = jax.random.randint(jax.random.key(1), (4, 8), 0, 50)
  # The layer's dispatchers are resolved where it is built, for the layout's expert axis (all_to_all where > 1).
  layer_on = lambda expert: make_moe_layer(typed(MoESettings, moe), 50, 2, 16, mesh=MeshFacts(1, expert))
  params = nn.unbox(layer_on(1).init(jax.random.key(2), x, ids, jnp.array(True))["params"])
  params = jax.tree.map(lambda a: a + 0.3, params)  # non-zero output projections

  def forward(p, x, layer):
    out, sown = layer.apply({"params": p}, x, ids, jnp.array(True), deterministic=False, mutable=[STATS])
    return out, sown

  def loss(p, x, layer):
    out, sown = forward(p, x, layer)
    return jnp.sum(out ** 2) + sum(jax.tree.leaves(layer_stats(sown)[""].losses))

  outs = {}
  for name, (devices, expert) in LAYOUTS.items():
    layer = layer_on(expert)
    forward_on, loss_on = (functools.partial(f, layer=layer) for f in (forward, loss))
    mesh = mesh_lib.make_mesh(ml_collections.ConfigDict({"expert": expert}), jax.devices()[:devices])
    compiled = mesh_lib.under_mesh(mesh, lambda: jax.jit(forward_on).lower(params, x).compile())()
    out, sown = compiled(params, x)
    grads = mesh_lib.under_mesh(mesh, jax.jit(jax.grad(loss_on)))(params, x)
    outs[name] = (np.asarray(out), flat(grads), np.asarray(layer_stats(sown)[""].dropped_fraction),
                  count(r"all-to-all\(", compiled.as_text()))
  ref_out, ref_grads, ref_dropped, _ = outs["one_device"]
  summary["topk"] = {name: {
      "out_diff": float(np.abs(out - ref_out).max()),
      "grad_diff": max(float(np.abs(g[k] - ref_grads[k]).max() / (np.abs(ref_grads[k]).max() + 1e-6)) for k in g),
      "dropped": float(dropped), "reference_dropped": float(ref_dropped), "grads": len(g), "all_to_all": a2a}
      for name, (out, g, dropped, a2a) in outs.items()}


def dropout_checks(summary: dict) -> None:
  """One MoE layer with expert dropout 0.3 and the shuffle on: the same output on 1 device, expert 4 and 2 x 2."""
  import flax.linen as nn
  import ml_collections
  from stablemoe_jax.models.moe import MeshFacts, make_moe_layer
  moe = tiny_config(1).model.moe
  x = jax.random.normal(jax.random.key(0), (4, 8, 8))
  ids = jax.random.randint(jax.random.key(1), (4, 8), 0, 50)
  outs = {}
  for rate in (0.0, 0.3):
    layer_on = lambda expert: make_moe_layer(typed(MoESettings, moe), 50, 2, 16, dropout=rate,
                                             mesh=MeshFacts(1, expert))
    params = nn.unbox(layer_on(1).init(jax.random.key(2), x, ids, jnp.array(True))["params"])
    params = jax.tree.map(lambda a: a + 0.3, params)  # non-zero output projections
    for name, (devices, expert) in LAYOUTS.items():
      if rate == 0.0 and name != "one_device":
        continue  # rate 0 is only the one-device reference of "dropout changes the output" (a compile a layout)
      apply = jax.jit(functools.partial(lambda p, x, layer: layer.apply(
          {"params": p}, x, ids, jnp.array(True), deterministic=False, rngs=step_rngs(jax.random.key(3))),
          layer=layer_on(expert)))
      mesh = mesh_lib.make_mesh(ml_collections.ConfigDict({"expert": expert}), jax.devices()[:devices])
      outs[(rate, name)] = np.asarray(mesh_lib.under_mesh(mesh, apply)(params, x))
  summary["dropout"] = {
      "max_diff_across_layouts": max(float(np.abs(outs[(0.3, n)] - outs[(0.3, "one_device")]).max()) for n in LAYOUTS),
      "dropout_changes_output": float(np.abs(outs[(0.3, "one_device")] - outs[(0.0, "one_device")]).max()),
  }


def main(out: pathlib.Path, part: str = "all") -> None:
  """part "dispatcher": the dispatcher checks alone (seconds); "all": everything."""
  if part == "dispatcher":
    summary = {}
    dispatcher_checks(summary)
    topk_checks(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 50, size=(8, 17)).astype(np.int32)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": np.ones((8, 16), np.float32)}
  arrays, summary = {}, {}
  for name, (devices, expert) in LAYOUTS.items():
    run_layout(name, devices, expert, batch, arrays, summary)
  dropout_checks(summary)
  np.savez(out / "layouts.npz", **arrays)
  (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
  main(pathlib.Path(sys.argv[1]), *sys.argv[2:])

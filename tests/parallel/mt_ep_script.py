"""Run by tests/parallel/test_translation_expert_parallel.py in a subprocess with 2 CPU devices.

For the tiny translation model and one batch with padding, on 1 device and on mesh.expert=2 (2 routing groups
both): the train-mode forward, every gradient leaf, what the MoE layers sow, and three train steps with their
metrics. Writes ``OUT/layouts.npz`` for the test to compare.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from configs import mt_cpu
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.experiment.step import make_train_step, step_rngs
from stablemoe_jax.models.routing import STATS, layer_stats
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.parallel import sharding as sharding_lib
from stablemoe_jax.tasks import make_task
from stablemoe_jax.train.optimizer import make_optimizer
from stablemoe_jax.train.state import create_train_state, train_state_shardings

LAYOUTS = {"one_device": (1, 1), "expert2": (2, 2)}  # name -> (devices, mesh.expert)
ROWS, LEN, VOCAB = 8, 16, 40


def tiny_config(expert: int):
  config = mt_cpu.get_config()
  model = config.model
  model.vocab_size, model.d_model, model.num_heads, model.num_layers, model.d_ff, model.max_len = VOCAB, 32, 2, 1, 64, LEN
  # One block a side: the MoE layer goes before it in the encoder and in the decoder (placement middle of 1),
  # so the gradients still flow back through a dense block into each MoE layer, with less to compile than two.
  model.dropout = 0.0
  model.moe.num_experts, model.moe.num_groups, model.moe.capacity_factor = 4, 2, 1.0
  model.moe.distilled_router.dim = 8
  config.train.steps, config.train.stage1_steps, config.train.warmup_steps = 3, 2, 1  # step 3 is stage 2
  config.train.batch_size, config.train.seq_len, config.train.learning_rate = ROWS, LEN, 3e-3
  config.mesh.expert = expert
  return config


def make_batch() -> dict[str, np.ndarray]:
  """Sentence pairs of random lengths, padded: source, decoder_inputs (bos + target), targets (+ eos), weights."""
  rng = np.random.default_rng(0)
  batch = {k: np.zeros((ROWS, LEN), np.int32) for k in ("source", "decoder_inputs", "targets")}
  batch["weights"] = np.zeros((ROWS, LEN), np.float32)
  for r in range(ROWS):
    n_src, n_tgt = rng.integers(3, LEN + 1), rng.integers(2, LEN)
    batch["source"][r, :n_src] = rng.integers(4, VOCAB, n_src)
    target = rng.integers(4, VOCAB, n_tgt)
    batch["decoder_inputs"][r, 0], batch["decoder_inputs"][r, 1:n_tgt + 1] = 2, target
    batch["targets"][r, :n_tgt], batch["targets"][r, n_tgt] = target, 3
    batch["weights"][r, :n_tgt + 1] = 1.0
  return batch


def flat(tree) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def run_layout(name: str, devices: int, expert: int, batch: dict, arrays: dict) -> None:
  config = tiny_config(expert)
  task = make_task(from_config(config))
  mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:devices])
  model, tx = task.build_model(from_config(config).model), make_optimizer(from_config(config).train)
  inputs = task.sample_inputs(from_config(config))
  shardings = train_state_shardings(model, tx, config.train.seq_len, mesh, sample_inputs=inputs)
  state = create_train_state(model, tx, config.seed, config.train.seq_len, mesh, sample_inputs=inputs,
                             shardings=shardings)
  batch = jax.device_put(batch, sharding_lib.batch_sharding(mesh))

  def loss_and_outputs(params):
    output, sown = model.apply({"params": params}, *task.model_inputs(batch), jnp.array(True), deterministic=False,
                               rngs=step_rngs(jax.random.key(5)), mutable=[STATS])
    aux = sum(jax.tree.leaves([stats.losses for stats in layer_stats(sown).values()]))
    return task.train_loss(output, batch) + aux, (output.logits(), sown)

  grads, (logits, sown) = mesh_lib.under_mesh(mesh, jax.jit(jax.grad(loss_and_outputs, has_aux=True)))(state.params)
  arrays[f"{name}/logits"] = np.asarray(logits)
  arrays.update({f"{name}/grad{k}": v for k, v in flat(grads).items()})
  arrays.update({f"{name}/sown{k}": v for k, v in flat(sown).items()})
  step = jax.jit(make_train_step(model, tx, from_config(config), task),
                 in_shardings=(shardings, sharding_lib.batch_sharding(mesh)),
                 out_shardings=(shardings, sharding_lib.replicated(mesh)))
  with jax.set_mesh(mesh):
    for i in range(3):
      state, metrics = step(state, batch)
      arrays.update({f"{name}/metrics/{i}/{k}": np.asarray(v) for k, v in metrics.items()})
  arrays.update({f"{name}/params{k}": v for k, v in flat(state.params).items()})


def main(out: str) -> None:
  batch, arrays = make_batch(), {}
  for name, (devices, expert) in LAYOUTS.items():
    run_layout(name, devices, expert, batch, arrays)
  np.savez(f"{out}/layouts.npz", **arrays)


if __name__ == "__main__":
  main(sys.argv[1])

"""``--mode=plan``: per-device memory and all-to-all traffic of a config on a mesh, before paying for one.

Parameters and optimizer state are exact: their shardings come from the same logical-axis rules as
training (:mod:`stablemoe_jax.parallel.sharding`) on an abstract mesh of the requested size, so no
device is needed. Activations are an estimate (the tensors a step keeps for its backward pass, per
microbatch); where this process has enough devices (``--cpu_devices=N`` on a laptop), the train step
is also compiled and XLA's own temporary-memory figure is reported beside it.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import AbstractMesh

from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.settings import RunSettings
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.experiment.step import make_train_step
from stablemoe_jax.models import routers
from stablemoe_jax.models.transformer import has_moe_layers, moe_positions
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.parallel import sharding as sharding_lib
from stablemoe_jax.tasks import make_task, task_name
from stablemoe_jax.train import state as state_lib
from stablemoe_jax.train.optimizer import make_optimizer

# The paper's vocabulary (GPT-2 BPE) where the config leaves it to the tokenizer (model.vocab_size = 0).
DEFAULT_PLAN_VOCAB = 50_257
GIB = 2**30


def _resolved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy with ``model.vocab_size`` set: translation's is its joint sentencepiece model's size."""
  config = ml_collections.ConfigDict(config.to_dict())
  if not config.model.vocab_size:
    translation = task_name(config) == "translation"
    config.model.vocab_size = config.data.sentencepiece_vocab_size if translation else DEFAULT_PLAN_VOCAB
  return config


def _abstract_init(run: RunSettings):
  """(task, model, optimizer, the state's init function with logical axes) of the run."""
  task = make_task(run)
  model, tx = task.build_model(run.model), make_optimizer(run.train)
  init = state_lib._boxed_init(model, tx, 0, run.train.seq_len, task.sample_inputs(run))  # pylint: disable=protected-access
  return task, model, tx, init


def num_moe_layers(run: RunSettings) -> int:
  """MoE layers of the model: the placement's positions, in each of the encoder and decoder for translation."""
  stacks = 2 if run.task == "translation" else 1
  return stacks * len(moe_positions(run.model.num_layers, run.model.moe.placement))


def _per_device_bytes(shardings: Any, shapes: Any) -> int:
  """Bytes one device holds of ``shapes`` laid out by ``shardings`` (a prefix tree of it)."""
  def one(sharding, shape):
    if not isinstance(shape, jax.ShapeDtypeStruct):  # an empty optax MaskedNode
      return 0
    return math.prod(sharding.shard_shape(shape.shape)) * shape.dtype.itemsize
  return int(sum(jax.tree.leaves(jax.tree.map(one, shardings, shapes))))


def state_bytes_per_device(run: RunSettings, num_devices: int) -> dict[str, int]:
  """Exact per-device bytes of parameters and optimizer state on a ``(data, expert)`` mesh of ``num_devices``."""
  mesh = AbstractMesh((num_devices // run.mesh.expert, run.mesh.expert), sharding_lib.MESH_AXES)
  _, _, _, init = _abstract_init(run)
  boxed = jax.eval_shape(init)
  shardings = sharding_lib.state_shardings(boxed, mesh)
  shapes = nn.unbox(boxed)
  return {"params": _per_device_bytes(shardings.params, shapes.params),
          "opt_state": _per_device_bytes(shardings.opt_state, shapes.opt_state),
          "params_total": int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes.params)))}


def activation_bytes_per_device(run: RunSettings, num_devices: int, microbatches: int) -> int:
  """Estimate of the activations one device keeps for the backward pass of one microbatch.

  Per token: each block keeps about ``10 d + 2 d_ff`` values (LayerNorm inputs and outputs, q/k/v,
  attention and FFN outputs, the ReLU input) plus its attention probabilities ``H * S``; each MoE
  sublayer ``(4 d + 2 d_ff_e)`` per capacity slot (``capacity_factor * k`` slots per token, capacity counting
  choices, plus the dispatch buffers; top-k routing adds its k - 1 more rows a token in and out, ``2 d`` each), and each shared expert (``model.moe.shared_experts``) its sublayers'
  ``(4 d + 2 d_ff_e)`` for every token; the LM head its float32 logits and their softmax (``2 V``). Translation:
  the encoder's blocks over the source and the decoder's over the target, each decoder block with a cross-attention
  (``4 d`` more and ``H * S`` more probabilities a token); its MoE layers split between the two.
  """
  model, train = run.model, run.train
  itemsize = jnp.dtype(model.dtype).itemsize
  tokens = train.batch_size // microbatches * train.seq_len / num_devices  # a stream's (source or target) tokens
  block = (10 * model.d_model + 2 * model.d_ff) * itemsize + model.num_heads * train.seq_len * 4
  per_token = model.num_layers * block
  if run.task == "translation":  # + the encoder over as many source tokens, + cross-attention
    per_token += model.num_layers * (block + 4 * model.d_model * itemsize + model.num_heads * train.seq_len * 4)
  if has_moe_layers(model):
    moe = model.moe
    layers = num_moe_layers(run)
    sublayers = max(1, moe.sublayers_per_expert // layers)
    top_k, shared = routers.top_k(moe), moe.shared_experts
    slots = max(moe.capacity_factor, 1.0) * top_k
    expert_values = sublayers * (4 * model.d_model + 2 * (moe.d_ff or model.d_ff))
    per_token += layers * slots * (expert_values + 2 * model.d_model) * itemsize
    if top_k > 1:  # each choice a row of its own on the way to the slots and back: k - 1 more [T, d] each way
      per_token += layers * (top_k - 1) * 2 * model.d_model * itemsize
    if shared > 0:  # every token through each shared expert, outside the capacity buffers
      per_token += layers * shared * expert_values * itemsize
  per_token += 2 * model.vocab_size * 4
  return int(tokens * per_token)


def all_to_all_bytes_per_device(run: RunSettings, num_devices: int) -> int:
  """Bytes one device sends through all-to-alls in one train step (forward and backward, every MoE layer).

  The capacity buffers travel: ``ceil(cf * k * T / G / N)`` slots per (group, expert), capacity counting choices;
  shared experts, replicated on every device, send nothing."""
  model, train, expert_devices = run.model, run.train, run.mesh.expert
  if not has_moe_layers(model) or expert_devices == 1:
    return 0
  moe = model.moe
  tokens = train.batch_size * train.seq_len  # the whole step, all microbatches
  capacity_slots = moe.num_experts * math.ceil(
      moe.capacity_factor * routers.top_k(moe) * tokens / moe.num_groups / moe.num_experts)
  buffer = capacity_slots * moe.num_groups / num_devices * model.d_model * jnp.dtype(model.dtype).itemsize
  layers = num_moe_layers(run)  # translation: each layer routes one stream (source or target) of the batch
  # Dispatch and return in the forward, their transposes in the backward; the local share stays put.
  return int(4 * layers * buffer * (expert_devices - 1) / expert_devices)


def compiled_temp_bytes(run: RunSettings, num_devices: int) -> int | None:
  """XLA's temporary memory per device for the compiled train step, or None without ``num_devices`` devices."""
  if jax.device_count() < num_devices:
    return None
  mesh = mesh_lib.make_mesh(run.mesh, jax.devices()[:num_devices])
  task, model, tx, init = _abstract_init(run)
  state_shardings = sharding_lib.state_shardings(jax.eval_shape(init), mesh)
  batch_sharding = sharding_lib.batch_sharding(mesh)
  step = jax.jit(make_train_step(model, tx, run, task), donate_argnums=0,
                 in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, sharding_lib.replicated(mesh)))
  shapes = jax.eval_shape(lambda: nn.unbox(init()))
  batch = task.batch_shapes(run.train.batch_size, run.train.seq_len)
  with jax.set_mesh(mesh):
    compiled = step.lower(shapes, batch).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def plan(config: ml_collections.ConfigDict, num_devices: int, memory_gib: float, compile_step: bool = True) -> dict:
  """The plan of ``config`` on ``num_devices`` accelerators of ``memory_gib`` GiB each (see the module doc)."""
  config = mesh_lib.resolve_layout(_resolved(config), num_devices)  # num_groups 0: one group per planned device
  validate_config(config, device_count=num_devices)  # every check a launch on num_devices devices makes
  run = settings_lib.from_config(config)  # typed once, after the layout and the vocabulary are resolved
  state = state_bytes_per_device(run, num_devices)
  grads = state["params"]  # float32, laid out as the parameters
  train = run.train
  rows_per_device = train.batch_size // num_devices
  options = []
  for microbatches in range(1, train.batch_size + 1):
    if train.batch_size % microbatches or (train.batch_size // microbatches) % num_devices:
      continue
    activations = activation_bytes_per_device(run, num_devices, microbatches)
    total = state["params"] + state["opt_state"] + grads + activations
    options.append({"microbatches": microbatches, "activations_gib": activations / GIB, "total_gib": total / GIB,
                    "fits": total <= memory_gib * GIB})
  chosen = next((o for o in options if o["microbatches"] == train.microbatches and o["fits"]), None)
  smallest = next((o for o in options if o["fits"]), None)
  result = {
      "devices": num_devices, "mesh": {"data": num_devices // run.mesh.expert, "expert": run.mesh.expert},
      "num_groups": run.model.moe.num_groups,
      "vocab_size": run.model.vocab_size, "rows_per_device": rows_per_device,
      "params_total_gib": state["params_total"] / GIB,
      "params_gib_per_device": state["params"] / GIB, "opt_state_gib_per_device": state["opt_state"] / GIB,
      "grads_gib_per_device": grads / GIB,
      "config_microbatches": train.microbatches,
      "activations_gib_per_device": activation_bytes_per_device(run, num_devices, train.microbatches) / GIB,
      "all_to_all_gib_per_step_per_device": all_to_all_bytes_per_device(run, num_devices) / GIB,
      "memory_gib": memory_gib,
      "fits_with_config_microbatches": chosen is not None,
      "smallest_microbatches_that_fit": smallest["microbatches"] if smallest else None,
  }
  if compile_step:
    temp = compiled_temp_bytes(run, num_devices)
    result["compiled_temp_gib_per_device"] = None if temp is None else temp / GIB
  if smallest is None:
    result["advice"] = ("does not fit even one row per device at a time: raise mesh.expert, use more devices, "
                        "or shrink the model.")
  return result


def host_memory_available() -> int | None:
  """Bytes of memory this host has available (``MemAvailable`` of /proc/meminfo; None where there is none)."""
  try:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def check_host_memory(config: ml_collections.ConfigDict, device_count: int, local_devices: int,
                      available: int | None) -> None:
  """Raises ConfigError when, on CPU devices (whose buffers all lie in this host's memory), the train state of this
  process's ``local_devices`` devices cannot fit in the ``available`` bytes: parameters, Adam state and gradients,
  laid out as on the ``device_count``-device mesh, each device its own copy of what it holds.

  A lower bound, so it refuses only what cannot run: without ``model.vocab_size`` the vocabulary counts as the
  sentencepiece size where that is known, else 1 (a word vocabulary is known only once the data is read). Made at
  launch before the data, it replaces the kernel's kill (exit status 137) after the data and the state's init.
  """
  if not available:
    return
  run = settings_lib.from_config(config)
  if not run.model.vocab_size:
    known = run.task == "translation" or run.data.tokenizer == "sentencepiece"
    vocab_size = int(run.data.sentencepiece_vocab_size) if known else 1
    run = dataclasses.replace(run, model=dataclasses.replace(run.model, vocab_size=vocab_size))
  state = state_bytes_per_device(run, device_count)
  per_device = 2 * state["params"] + state["opt_state"]  # the gradients are laid out as the parameters
  need = local_devices * per_device
  if need > available:
    raise ConfigError(
        f"the train state needs at least {need / GIB:.1f} GiB of this host's memory on its {local_devices} CPU "
        f"device(s) ({per_device / GIB:.2f} GiB each: parameters, Adam state, gradients), more than the "
        f"{available / GIB:.1f} GiB available; use fewer CPU devices (--cpu_devices), a smaller model, or "
        f"accelerators (--mode=plan --plan_devices=N sizes a cluster).")


def check_plan_flags(num_devices: int | None, memory_gib: float) -> None:
  if not num_devices or num_devices < 1:
    raise ConfigError("--mode=plan needs --plan_devices=N, the number of accelerators to plan for.")
  if memory_gib <= 0:
    raise ConfigError(f"--plan_memory_gib={memory_gib} must be positive (an H100 has 80).")


def format_plan(result: dict) -> str:
  """Human-readable lines of a plan."""
  rows = [
      f"plan: {result['devices']} devices, mesh data={result['mesh']['data']} x expert={result['mesh']['expert']}, "
      f"vocab {result['vocab_size']}, routing groups {result['num_groups']}",
      f"  parameters (all)           {result['params_total_gib']:8.2f} GiB",
      f"  per device: parameters     {result['params_gib_per_device']:8.2f} GiB (exact)",
      f"              optimizer      {result['opt_state_gib_per_device']:8.2f} GiB (exact)",
      f"              gradients      {result['grads_gib_per_device']:8.2f} GiB",
      f"              activations    {result['activations_gib_per_device']:8.2f} GiB (estimate, "
      f"train.microbatches={result['config_microbatches']})",
  ]
  if result.get("compiled_temp_gib_per_device") is not None:
    rows.append(f"              XLA temp       {result['compiled_temp_gib_per_device']:8.2f} GiB (compiled on host CPU)")
  rows += [
      f"  all-to-all per step        {result['all_to_all_gib_per_step_per_device']:8.2f} GiB sent per device",
      f"  fits {result['memory_gib']:g} GiB with train.microbatches={result['config_microbatches']}: "
      f"{'yes' if result['fits_with_config_microbatches'] else 'no'}; smallest train.microbatches that fits: "
      f"{result['smallest_microbatches_that_fit']}",
  ]
  return "\n".join(rows)


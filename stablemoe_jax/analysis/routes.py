"""Jitted functions that return, per MoE layer, where each token goes (sown by MoELayer into ROUTING)."""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from stablemoe_jax.core.settings import ModelSettings
from stablemoe_jax.models.routing import ROUTING


def analysis_model(task, model: ModelSettings):
  """The run's model (``task.build_model`` of its ``model`` settings) without dropout, so that training-mode
  routing depends on the parameters alone."""
  return task.build_model(dataclasses.replace(model, dropout=0.0))


def _natural_key(name: str):
  return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def sorted_layers(per_layer: dict) -> list[str]:
  """Layer names in model order (moe_2 before moe_10)."""
  return sorted(per_layer, key=_natural_key)


def _sown(sown: dict, name: str) -> dict[str, jax.Array]:
  """{layer path: value} of the ROUTING values called ``name``."""
  flat = traverse_util.flatten_dict(sown.get(ROUTING, {}), sep="/")
  return {key.rsplit("/", 1)[0]: value[0] for key, value in flat.items() if key.rsplit("/", 1)[-1] == name}


def _training_and_inference(model, key, params, inputs, in_stage1) -> tuple[dict, dict]:
  """The ROUTING values the model sows in training mode (stage ``in_stage1``, dropout key ``key``) and at
  inference."""
  _, train = model.apply({"params": params}, *inputs, in_stage1, deterministic=False, rngs={"dropout": key},
                         mutable=[ROUTING])
  _, inference = model.apply({"params": params}, *inputs, jnp.array(False), deterministic=True, mutable=[ROUTING])
  return train, inference


def sown_choices(sown: dict) -> dict[str, jax.Array]:
  """{layer path: int32 [T, k]}: every choice of each token, first (highest-ranked) first; a top-1 layer sows only
  ``expert_index`` [T], which is its [T, 1]."""
  first, every = _sown(sown, "expert_index"), _sown(sown, "expert_choices")
  return {layer: every[layer] if layer in every else index[:, None] for layer, index in first.items()}


def make_sample_router(model, seed: int, choices: bool = False):
  """``(params, inputs, in_stage1) -> ({layer: int32 [R*S]} training routing, {layer: ...} inference)``.

  ``inputs``: the model's arguments before ``in_stage1`` (``task.model_inputs``), each [R, S].
  Training routing: the model in training mode (``deterministic=False``, the given stage) with a fixed
  dropout key for any router that draws noise in training. Inference routing: as evaluation does.
  ``choices``: every one of a token's k choices, ``{layer: int32 [R*S, k]}`` (first first; k = 1: [R*S, 1]),
  instead of its first.
  """
  key = jax.random.key(seed)
  read = sown_choices if choices else lambda sown: _sown(sown, "expert_index")

  def route(params, inputs, in_stage1):
    train, inference = _training_and_inference(model, key, params, inputs, in_stage1)
    return read(train), read(inference)

  return route


def make_declining_router(model):
  """``(params, inputs) -> ({layer: int32 [T, k]} training choices, {layer: [T]} each token's largest training
  gate, {layer: int32 [T, k]} inference choices)``: stage 1's training routing with dropout off (``model``:
  ``analysis_model``'s), and the inference routing; choices first first (k = 1: [T, 1]); ``inputs`` as
  ``make_sample_router``'s. The largest gate is the one the collapse guard's low-gate rule reads
  (``models.routing.routing_health``): a top-k router may rank first a choice with a smaller gate."""
  key = jax.random.key(0)

  def route(params, inputs):
    train, inference = _training_and_inference(model, key, params, inputs, jnp.array(True))
    first_gates, every_gate = _sown(train, "gate"), _sown(train, "gate_choices")
    largest = {layer: every_gate[layer].max(axis=-1) if layer in every_gate else gate
               for layer, gate in first_gates.items()}
    return sown_choices(train), largest, sown_choices(inference)

  return route


def make_split_router(model):
  """``(params, inputs) -> {layer: (int32 [B*S, k] experts, float32 [B*S, k] gates)}`` under the inference routing,
  every one of a token's k choices, first first (k = 1: [B*S, 1]); ``inputs``: the model's arguments before
  ``in_stage1``, each [B, S]."""
  def route(params, inputs):
    _, sown = model.apply({"params": params}, *inputs, jnp.array(False), deterministic=True, mutable=[ROUTING])
    experts, first_gates, gates = sown_choices(sown), _sown(sown, "gate"), _sown(sown, "gate_choices")
    return {layer: (experts[layer], gates.get(layer, first_gates[layer][:, None]).astype(jnp.float32))
            for layer in experts}
  return route


def choice_sets_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """int [T, k] (or [T] for top-1) choices twice -> bool [T]: the token's two sets of experts differ (order
  ignored)."""
  as_sets = lambda choices: np.sort(np.asarray(choices).reshape(len(choices), -1), axis=-1)
  return (as_sets(a) != as_sets(b)).any(axis=-1)


def stack_layers(per_layer: dict) -> tuple[list[str], np.ndarray]:
  """{layer: [T, ...]} (device or host) -> (layer names in model order, numpy [L, T, ...])."""
  per_layer = jax.device_get(per_layer)
  layers = sorted_layers(per_layer)
  return layers, np.stack([np.asarray(per_layer[layer]) for layer in layers])

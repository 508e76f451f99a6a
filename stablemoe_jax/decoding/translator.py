"""Translation with a trained TransformerSeq2Seq: encode once, project each decoder block's cross-attention
keys and values once, then greedy or beam search with the self-attention's key/value cache.

The decoding model routes without a capacity limit (``model.moe.eval_capacity_factor = 0``), so no token is
ever dropped and each decode step's token goes to the expert a teacher-forced forward over the same prefix
gives it (``tests/models/test_translation_model.py``).

On a mesh of several devices (a run's ``exp.mesh``, any layout, any number of processes) the sentences are
split over every device and the parameters replicated for decoding (all-gathered once per batch, inside the
program); each device routes its own sentences (one routing group a device), which with no capacity limit gives
every token the expert one device gives it (``tests/decoding/test_decoding_devices.py``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stablemoe_jax.core.constants import BOS_ID, EOS_ID
from stablemoe_jax.core.settings import ModelSettings
from stablemoe_jax.decoding import search
from stablemoe_jax.models.seq2seq import CACHE, PAD_ID, TransformerSeq2Seq, empty_decode_cache

FORBIDDEN_IDS = (PAD_ID, BOS_ID)  # never generated


def decoding_model_config(model: ModelSettings, groups: int = 1) -> ModelSettings:
  """``model`` with no-drop routing (capacity = every token of its group) in ``groups`` routing groups."""
  moe = dataclasses.replace(model.moe, eval_capacity_factor=0.0, num_groups=groups)
  return dataclasses.replace(model, moe=moe, dropout=0.0)


def make_translate_fn(model_config: ModelSettings, beam_size: int, max_len: int, length_penalty: float = 1.0,
                      mesh: Mesh | None = None) -> Callable[[dict, np.ndarray], tuple[jax.Array, jax.Array]]:
  """A jitted ``(params, source int32 [B, Ss]) -> (tokens int32 [B, max_len], scores float32 [B])``.

  ``tokens`` is the best hypothesis (eos, then pad); ``beam_size`` 1 is greedy search. ``max_len`` (at most
  ``model.max_len``) bounds the generated tokens, eos included. With a ``mesh`` of D > 1 devices the B sentences
  are split over its devices (B is padded to a multiple of D with empty sources inside; every process passes the
  same ``source``) and the outputs are replicated.
  """
  if not 0 < max_len <= model_config.max_len:
    raise ValueError(f"decoding max_len={max_len} must lie in (0, model.max_len={model_config.max_len}].")
  devices = 1 if mesh is None else mesh.devices.size
  model = TransformerSeq2Seq(decoding_model_config(model_config, groups=devices))
  stage2 = jnp.array(False)

  def translate(params, source):
    batch = source.shape[0]
    rows = batch * beam_size
    encoded = model.apply({"params": params}, source, stage2, method=model.encode)  # [B, Ss, d]
    # Each decoder block's cross-attention keys and values [B, H, Ss, Dh], projected once per sentence and
    # then repeated over its beams (row b * K + k); constant over the steps, so not in the reordered cache.
    cross = model.apply({"params": params}, encoded, method=model.cross_keys_values)
    cross, source = jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0), (cross, source))
    cache = empty_decode_cache(model, source, max_len, stage2)  # [rows, ...]: source is repeated over the beams

    def step_fn(tokens, cache, position):
      head, variables = model.apply({"params": params, CACHE: cache}, cross, source, tokens[:, None], stage2,
                                    decode=True, position=position, method=model.decode, mutable=[CACHE])
      return jax.nn.log_softmax(head.logits()[:, 0]), variables[CACHE]

    if beam_size == 1:
      return search.greedy_search(step_fn, cache, batch, max_len, BOS_ID, EOS_ID, PAD_ID, FORBIDDEN_IDS)
    seqs, scores = search.beam_search(step_fn, cache, batch, beam_size, max_len, BOS_ID, EOS_ID, PAD_ID,
                                      FORBIDDEN_IDS, length_penalty)
    return seqs[:, 0], scores[:, 0]

  if devices == 1:
    return jax.jit(translate)
  return _split_over_devices(translate, mesh)


def _split_over_devices(translate, mesh: Mesh):
  """``translate`` with its sentences split over every device of ``mesh`` and its parameters replicated."""
  replicated = NamedSharding(mesh, PartitionSpec())
  rows = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))  # rows over all axes: one block a device

  @jax.jit
  def on_mesh(params, source):
    params = jax.lax.with_sharding_constraint(params, replicated)  # whatever layout training left them in
    tokens, scores = translate(params, jax.lax.with_sharding_constraint(source, rows))
    return jax.lax.with_sharding_constraint((tokens, scores), replicated)

  def run(params, source: np.ndarray):
    batch = source.shape[0]
    padded = np.full((-(-batch // mesh.devices.size) * mesh.devices.size, source.shape[1]), PAD_ID, np.int32)
    padded[:batch] = source
    tokens, scores = on_mesh(params, jax.make_array_from_callback(padded.shape, rows, lambda index: padded[index]))
    return np.asarray(tokens)[:batch], np.asarray(scores)[:batch]  # replicated: each process reads its copy

  return run

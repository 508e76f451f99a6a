"""The encoder-decoder: cached decoding, padding masks, and which ids each MoE layer's router reads."""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.conftest import jit_init
from tests.mt_fixtures import tiny_model_config

from configs import mt_cpu

from stablemoe_jax.models.routing import ROUTING, STATS, layer_stats
from stablemoe_jax.models.seq2seq import CACHE, TransformerSeq2Seq, empty_decode_cache
from stablemoe_jax.core.settings import ModelSettings, typed

SOURCE = jnp.array([[4, 9, 10, 11, 3, 0, 0], [5, 12, 13, 14, 15, 16, 3]], jnp.int32)
DECODER_INPUTS = jnp.array([[2, 20, 21, 22, 23], [2, 30, 31, 32, 0]], jnp.int32)
STAGE2 = jnp.array(False)


def _model_and_params(router: str = "stablemoe"):
  config = tiny_model_config(router=router)
  model = TransformerSeq2Seq(typed(ModelSettings, config.model))
  params = jit_init(model, 0, SOURCE, DECODER_INPUTS, jnp.array(True))["params"]
  return model, params


def _decode_step_by_step(model, params, mutable=(CACHE,), cross_cache: bool = True):
  """Logits [B, St, V] and the sown collections of each step, one decoder position at a time with the cache.

  ``cross_cache``: the steps read the cross-attention keys and values computed once (``cross_keys_values``, as
  the translator does); else each step projects them from the encoder output. Every call is jitted: run eagerly,
  Flax compiles each op of the model as a program of its own (~300 compiles, most of this test's time).
  """
  cache = empty_decode_cache(model, SOURCE, model.config.max_len, STAGE2)
  memory = jax.jit(lambda p: model.apply({"params": p}, SOURCE, STAGE2, method=model.encode))(params)
  if cross_cache:
    memory = jax.jit(lambda p, m: model.apply({"params": p}, m, method=model.cross_keys_values))(params, memory)
  step = jax.jit(lambda cache, tokens, position: model.apply(  # one compile for every position (traced)
      {"params": params, CACHE: cache}, memory, SOURCE, tokens, STAGE2, decode=True, position=position,
      method=model.decode, mutable=list(mutable)))
  logits, sown = [], []
  for i in range(DECODER_INPUTS.shape[1]):
    step_head, variables = step(cache, DECODER_INPUTS[:, i:i + 1], jnp.int32(i))
    cache = variables[CACHE]
    logits.append(step_head.logits())
    sown.append(variables)
  return jnp.concatenate(logits, axis=1), sown


@pytest.mark.slow
def test_cached_decoding_gives_the_logits_of_the_full_forward():
  model, params = _model_and_params()
  full = jax.jit(lambda p: model.apply({"params": p}, SOURCE, DECODER_INPUTS, STAGE2).logits())(params)
  for cross_cache in (True, False):  # cross-attention keys/values computed once, or projected at every step
    cached, _ = _decode_step_by_step(model, params, cross_cache=cross_cache)
    np.testing.assert_allclose(cached, full, atol=2e-5)


def test_cross_keys_values_are_the_cross_attention_projections_of_the_encoder_output():
  model, params = _model_and_params()
  encoded = model.apply({"params": params}, SOURCE, STAGE2, method=model.encode)
  cross = model.apply({"params": params}, encoded, method=model.cross_keys_values)
  assert len(cross) == model.config.num_layers
  for i, (k, v) in enumerate(cross):  # x @ kernel [d, H, Dh] + bias, heads first, by numpy
    for name, projected in (("key", k), ("value", v)):
      dense = params[f"decoder_blocks_{i}"]["cross_attention"][name]
      expected = np.einsum("bsd,dhk->bhsk", np.asarray(encoded), np.asarray(dense["kernel"])) + np.asarray(dense["bias"])[:, None]
      np.testing.assert_allclose(projected, expected, atol=1e-5)


def _param_tree(model_config) -> dict[str, str]:
  """{path: "dtype[shape]"} of the parameters ``init`` creates (shapes only, nothing computed)."""
  x = jnp.zeros((2, model_config.max_len), jnp.int32)
  shapes = jax.eval_shape(lambda: TransformerSeq2Seq(typed(ModelSettings, model_config)).init(jax.random.key(0), x, x, jnp.array(True)))
  return {jax.tree_util.keystr(path): f"{leaf.dtype}{list(leaf.shape)}"
          for path, leaf in jax.tree_util.tree_flatten_with_path(shapes["params"])[0]}


def test_parameter_tree_is_the_one_checkpoints_were_written_with():
  """Names and shapes of every parameter, against the listing written by the code before the cross-attention
  cache (commit f3459bc): checkpoints trained with it must restore unchanged."""
  fixture = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "seq2seq_param_trees.json"
  expected = json.loads(fixture.read_text())
  mt = mt_cpu.get_config().model
  mt.vocab_size = 8000
  for name, model_config in (("tiny", tiny_model_config().model), ("mt_cpu", mt)):
    assert _param_tree(model_config) == expected[name], name


def test_source_padding_does_not_change_the_output():
  model, params = _model_and_params()
  longer = jnp.pad(SOURCE, ((0, 0), (0, 3)))  # three more pad positions
  np.testing.assert_allclose(model.apply({"params": params}, longer, DECODER_INPUTS, STAGE2).logits(),
                             model.apply({"params": params}, SOURCE, DECODER_INPUTS, STAGE2).logits(), atol=1e-5)


def test_encoder_router_reads_source_ids_and_decoder_router_reads_decoder_inputs():
  model, params = _model_and_params("hash")  # the hash router's expert is table[token id]
  _, sown = model.apply({"params": params}, SOURCE, DECODER_INPUTS, STAGE2, mutable=[ROUTING])
  for side, ids in (("encoder", SOURCE), ("decoder", DECODER_INPUTS)):
    table = params[f"{side}_moe_0"]["router"]["table"]
    routed = sown[ROUTING][f"{side}_moe_0"]["expert_index"][0]
    np.testing.assert_array_equal(routed, np.asarray(table)[np.asarray(ids).reshape(-1)])


@pytest.mark.slow
def test_a_decode_step_routes_like_teacher_forcing_and_drops_nothing():
  for router in ("stablemoe", "switch"):  # distilled (token id) and learned (hidden state) routing
    model, params = _model_and_params(router)
    _, forced = jax.jit(lambda p: model.apply({"params": p}, SOURCE, DECODER_INPUTS, STAGE2, mutable=[ROUTING]))(params)
    forced_experts = np.asarray(forced[ROUTING]["decoder_moe_0"]["expert_index"][0]).reshape(DECODER_INPUTS.shape)
    _, steps = _decode_step_by_step(model, params, mutable=(CACHE, ROUTING, STATS))
    for i, variables in enumerate(steps):
      np.testing.assert_array_equal(variables[ROUTING]["decoder_moe_0"]["expert_index"][0], forced_experts[:, i])
      assert float(layer_stats(variables)["decoder_moe_0"].dropped_fraction) == 0.0

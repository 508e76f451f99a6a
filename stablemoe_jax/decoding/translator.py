"""Translation with a trained TransformerSeq2Seq: encode once, project each decoder block's cross-attention
keys and values once, then greedy or beam search with the self-attention's key/value cache.

The decoding model routes without a capacity limit (``model.moe.eval_capacity_factor = 0``, one routing
group), so no token is ever dropped and each decode step's token goes to the expert a teacher-forced
forward over the same prefix gives it (``tests/test_translation_model.py``).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections

from stablemoe_jax.data.joint_tokenizer import BOS_ID, EOS_ID
from stablemoe_jax.decoding import search
from stablemoe_jax.models.seq2seq import CACHE, PAD_ID, TransformerSeq2Seq

FORBIDDEN_IDS = (PAD_ID, BOS_ID)  # never generated


def decoding_model_config(model_config) -> ml_collections.ConfigDict:
  """``model_config`` with no-drop routing: capacity = every token of the (single) routing group."""
  config = ml_collections.ConfigDict(model_config.to_dict())
  config.moe.eval_capacity_factor = 0.0
  config.moe.num_groups = 1
  config.dropout = 0.0
  return config


def make_translate_fn(model_config, beam_size: int, max_len: int, length_penalty: float = 1.0
                      ) -> Callable[[dict, jax.Array], tuple[jax.Array, jax.Array]]:
  """A jitted ``(params, source int32 [B, Ss]) -> (tokens int32 [B, max_len], scores float32 [B])``.

  ``tokens`` is the best hypothesis (eos, then pad); ``beam_size`` 1 is greedy search. ``max_len`` (at most
  ``model.max_len``) bounds the generated tokens, eos included.
  """
  if not 0 < max_len <= model_config.max_len:
    raise ValueError(f"decoding max_len={max_len} must lie in (0, model.max_len={model_config.max_len}].")
  model = TransformerSeq2Seq(decoding_model_config(model_config))
  stage2 = jnp.array(False)

  def translate(params, source):
    batch = source.shape[0]
    rows = batch * beam_size
    encoded = model.apply({"params": params}, source, stage2, method=model.encode)  # [B, Ss, d]
    # Each decoder block's cross-attention keys and values [B, H, Ss, Dh], projected once per sentence and
    # then repeated over its beams (row b * K + k); constant over the steps, so not in the reordered cache.
    cross = model.apply({"params": params}, encoded, method=model.cross_keys_values)
    cross, source = jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0), (cross, source))
    cache_shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), source, jnp.zeros((rows, max_len), jnp.int32),
                                                     stage2, decode=True)[CACHE])
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)

    def step_fn(tokens, cache, position):
      logits, variables = model.apply({"params": params, CACHE: cache}, cross, source, tokens[:, None], stage2,
                                      decode=True, position=position, method=model.decode, mutable=[CACHE])
      return jax.nn.log_softmax(logits[:, 0]), variables[CACHE]

    if beam_size == 1:
      return search.greedy_search(step_fn, cache, batch, max_len, BOS_ID, EOS_ID, PAD_ID, FORBIDDEN_IDS)
    seqs, scores = search.beam_search(step_fn, cache, batch, beam_size, max_len, BOS_ID, EOS_ID, PAD_ID,
                                      FORBIDDEN_IDS, length_penalty)
    return seqs[:, 0], scores[:, 0]

  return jax.jit(translate)

"""Greedy and beam search: beam size 1 is greedy, and beam search finds the brute-force best hypothesis."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.conftest import jit_init
from tests.mt_fixtures import tiny_model_config

from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, EOS_ID
from stablemoe_jax.decoding import search
from stablemoe_jax.decoding.translator import FORBIDDEN_IDS, make_translate_fn
from stablemoe_jax.models.seq2seq import PAD_ID, TransformerSeq2Seq
from stablemoe_jax.core.settings import ModelSettings, typed

SOURCE = jnp.array([[4, 5, 3, 0], [5, 4, 4, 3]], jnp.int32)


def _peaked_params(model, seed: int):
  """Initial parameters with a 6x larger embedding, so the next-token distributions are far from uniform."""
  params = jit_init(model, seed, SOURCE, SOURCE, jnp.array(True))["params"]
  return {**params, "embed": {"embedding": params["embed"]["embedding"] * 6.0}}


@pytest.mark.slow  # ~30 s on 2 cores
def test_beam_size_one_is_greedy_search():
  config = tiny_model_config(vocab_size=40).model
  params = _peaked_params(TransformerSeq2Seq(typed(ModelSettings, config)), seed=1)
  greedy_tokens, greedy_sums = make_translate_fn(typed(ModelSettings, config), 1, 12)(params, SOURCE)
  model = TransformerSeq2Seq(typed(ModelSettings, config))
  encoded = jax.jit(lambda p, s: model.apply({"params": p}, s, jnp.array(False), method=model.encode))(params, SOURCE)
  cache = jax.tree.map(jnp.zeros_like, jit_init(model, 0, SOURCE, jnp.zeros((2, 12), jnp.int32),
                                                  jnp.array(False), decode=True)["cache"])

  def step_fn(tokens, cache, position):
    head, variables = model.apply({"params": params, "cache": cache}, encoded, SOURCE, tokens[:, None],
                                  jnp.array(False), decode=True, position=position, method=model.decode,
                                  mutable=["cache"])
    return jax.nn.log_softmax(head.logits()[:, 0]), variables["cache"]

  # beam search itself with K = 1 (make_translate_fn would run greedy search for it)
  seqs, scores = search.beam_search(step_fn, cache, 2, 1, 12, BOS_ID, EOS_ID, PAD_ID, FORBIDDEN_IDS, 0.7)
  np.testing.assert_array_equal(seqs[:, 0], greedy_tokens)
  lengths = np.sum(np.asarray(greedy_tokens) != PAD_ID, axis=1)
  np.testing.assert_allclose(scores[:, 0], np.asarray(greedy_sums) / lengths**0.7, rtol=1e-5)


def _brute_force_best(model, params, source, vocab_size: int, max_len: int, length_penalty: float):
  """The best-scoring sequence of every allowed one of at most max_len tokens ending in eos, by teacher forcing."""
  allowed = [t for t in range(vocab_size) if t not in FORBIDDEN_IDS and t != EOS_ID]
  candidates = [list(body) + [EOS_ID] for n in range(max_len) for body in itertools.product(allowed, repeat=n)]
  decoder_inputs = np.full((len(candidates), max_len), PAD_ID, np.int32)
  for i, c in enumerate(candidates):
    decoder_inputs[i, :len(c)] = [BOS_ID] + c[:-1]
  sources = jnp.repeat(source[None], len(candidates), axis=0)
  forward = jax.jit(lambda p, s, d: model.apply({"params": p}, s, d, jnp.array(False)).logits())
  log_probs = jax.nn.log_softmax(forward(params, sources, decoder_inputs))
  scores = [sum(float(log_probs[i, j, t]) for j, t in enumerate(c)) / len(c)**length_penalty
            for i, c in enumerate(candidates)]
  best = int(np.argmax(scores))
  return candidates[best], scores[best]


@pytest.mark.slow
def test_beam_search_finds_the_brute_force_best_hypothesis():
  vocab_size, max_len, length_penalty = 7, 3, 1.0  # 3 allowed tokens + eos: 1 + 3 + 9 = 13 hypotheses
  config = tiny_model_config(vocab_size=vocab_size).model
  model = TransformerSeq2Seq(typed(ModelSettings, config))
  source = jnp.array([[4, 5, 6, 3], [6, 6, 3, 0]], jnp.int32)
  params = _peaked_params(model, seed=0)
  tokens, scores = make_translate_fn(typed(ModelSettings, config), 16, max_len, length_penalty)(params, source)  # 16 >= 13: exhaustive
  for row in range(source.shape[0]):
    best, best_score = _brute_force_best(model, params, source[row], vocab_size, max_len, length_penalty)
    np.testing.assert_array_equal(np.asarray(tokens[row, :len(best)]), best)
    np.testing.assert_allclose(float(scores[row]), best_score, rtol=1e-5)

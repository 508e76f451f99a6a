"""The two tasks (tasks/lm.py, tasks/translation.py) on hand-built settings and batches, no data: which task a
config makes, how each describes its evaluation, which batch entries and tokens it routes, and its losses against
values computed by hand."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from stablemoe_jax.core.settings import from_config
from stablemoe_jax.models.head import HeadInputs
from stablemoe_jax.tasks import make_task
from stablemoe_jax.tasks.lm import LanguageModelTask
from stablemoe_jax.tasks.translation import TranslationTask

PACKING = {"source_segments", "source_positions", "target_segments", "target_positions"}


def _translation(**data) -> TranslationTask:
  return make_task(from_config({"task": "translation", "data": data, "train": {"label_smoothing": 0.1}}))


def test_the_config_s_task_names_the_task_and_an_old_config_is_a_language_model():
  assert isinstance(make_task(from_config({})), LanguageModelTask)  # written before the key existed
  assert isinstance(make_task(from_config({"task": "lm"})), LanguageModelTask)
  assert isinstance(_translation(), TranslationTask)


@pytest.mark.parametrize("stride, expected", [(0, {"mode": "blocks", "seq_len": 128, "stride": 128}),
                                              (128, {"mode": "blocks", "seq_len": 128, "stride": 128}),
                                              (32, {"mode": "sliding", "seq_len": 128, "stride": 32})])
def test_the_language_model_describes_blocks_or_sliding_windows(stride, expected):
  settings = from_config({"eval": {"seq_len": 128, "stride": stride}})
  assert LanguageModelTask().eval_description(settings) == expected


def test_translation_describes_teacher_forced_sentences_with_its_limit():
  settings = from_config({"task": "translation", "eval": {"seq_len": 48, "max_sentences": 7}})
  assert _translation().eval_description(settings) == {"mode": "teacher_forced_sentences", "seq_len": 48,
                                                       "max_sentences": 7}


def test_packed_translation_batches_carry_the_segments_and_positions():
  plain, packed = _translation().batch_shapes(4, 32), _translation(pack_pairs=True).batch_shapes(4, 32)
  assert set(plain) == {"source", "decoder_inputs", "targets", "weights"}
  assert set(packed) == set(plain) | PACKING
  assert all(s.shape == (4, 32) for s in packed.values()) and packed["weights"].dtype == jnp.float32
  batch = {name: np.zeros((1, 2), np.int32) for name in packed}
  assert set(_translation(pack_pairs=True).model_keywords(batch)) == PACKING
  assert _translation().model_keywords({"source": batch["source"]}) == {}


def test_translation_routes_the_source_in_the_encoder_and_the_decoder_inputs_in_the_decoder():
  batch = {"source": np.array([[5, 6, 0, 0]]), "decoder_inputs": np.array([[1, 7, 8, 0]]),
           "weights": np.array([[1.0, 1.0, 1.0, 0.0]])}
  ids, mask = _translation().routing_tokens("encoder_moe_0", batch)
  assert ids.tolist() == [[5, 6, 0, 0]] and mask.tolist() == [[True, True, False, False]]  # pad is no token
  ids, mask = _translation().routing_tokens("decoder_moe_1", batch)
  assert ids.tolist() == [[1, 7, 8, 0]] and mask.tolist() == [[True, True, True, False]]
  ids, mask = LanguageModelTask().routing_tokens("moe_0", {"inputs": np.array([[3, 4]]),
                                                           "weights": np.array([[1.0, 0.0]])})
  assert ids.tolist() == [[3, 4]] and mask.tolist() == [[True, False]]


def _head(logits: list[list[float]]) -> HeadInputs:
  """The model output whose logits are ``logits`` [S, V]: hidden states ``logits`` against an identity embedding."""
  vocab = len(logits[0])
  return HeadInputs(jnp.asarray([logits], jnp.float32), jnp.eye(vocab, dtype=jnp.float32), vocab, 0)


def test_the_losses_by_hand():
  """Two positions over 3 ids, the second weighted 0: the LM's loss is the first token's NLL; translation's, with
  label smoothing 0.1, that NLL against 0.9 one-hot + 0.1 / 3; the evaluation sums count weighted tokens only."""
  head = _head([[2.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
  batch = {"targets": jnp.asarray([[0, 1]]), "weights": jnp.asarray([[1.0, 0.0]], jnp.float32)}
  lse = math.log(math.exp(2.0) + 2.0)
  assert float(LanguageModelTask().train_loss(head, batch)) == pytest.approx(lse - 2.0, rel=1e-6)
  smoothed = lse - 0.9 * 2.0 - 0.1 * (2.0 + 0.0 + 0.0) / 3
  assert float(_translation().train_loss(head, batch)) == pytest.approx(smoothed, rel=1e-6)
  for task in (LanguageModelTask(), _translation()):  # evaluation scores the plain NLL, whatever the smoothing
    sums = task.eval_sums(head, batch)
    assert float(sums["nll_sum"]) == pytest.approx(lse - 2.0, rel=1e-6) and float(sums["tokens"]) == 1.0

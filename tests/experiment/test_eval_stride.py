"""Sliding-window evaluation: every prediction scored once, with the promised context, equal to a per-window loop."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from tests.conftest import share_prepared_ptb

from stablemoe_jax.data.lm import blocks
from stablemoe_jax.data.lm import pipeline
from stablemoe_jax.data.lm.stream import TokenStream
from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment.step import token_nll


def _stream(num_tokens: int) -> TokenStream:
  """A stream whose token at position p is p + 100 (so a target names its own position), in uneven records."""
  tokens = np.arange(num_tokens, dtype=np.int32) + 100
  cuts = np.cumsum([3, 7, 1, 11, 5] * num_tokens)
  return TokenStream(np.split(tokens, cuts[cuts < num_tokens]))


@pytest.mark.parametrize("num_tokens", [2, 9, 10, 23, 57])
@pytest.mark.parametrize("stride", [1, 3, 5, 8])
def test_every_prediction_is_scored_exactly_once_with_enough_context(num_tokens, stride):
  seq_len, batch_size = 8, 3
  scored, total_weight = [], 0.0
  for batch in pipeline.eval_batches(_stream(num_tokens), batch_size, seq_len, stride=stride):
    assert batch["inputs"].shape == (batch_size, seq_len)
    total_weight += batch["weights"].sum()
    for inputs, targets, weights in zip(batch["inputs"], batch["targets"], batch["weights"]):
      for j in np.flatnonzero(weights):
        target_position = targets[j] - 100
        assert target_position == inputs[j] - 100 + 1  # the next token of its input
        # Context: the window's tokens up to and including the input; the stream's start excepted.
        context = j + 1
        assert context >= min(seq_len - stride + 1, target_position), (j, target_position)
        np.testing.assert_array_equal(inputs[: j + 1] - 100, np.arange(target_position - j - 1, target_position))
        scored.append(int(target_position))
  assert sorted(scored) == list(range(1, num_tokens))
  assert total_weight == num_tokens - 1


def test_stride_equal_to_seq_len_gives_the_non_overlapping_rows():
  stream = _stream(45)
  sliding = blocks.SlidingEvalRows(stream, 8, 8)
  rows = blocks.EvalRows(stream, 8)
  assert len(sliding) == len(rows) == 6
  for i in range(len(rows)):
    for key in ("inputs", "targets", "weights"):
      np.testing.assert_array_equal(sliding[i][key], rows[i][key])


@pytest.mark.slow
def test_sliding_evaluation_equals_a_per_window_reference(tiny_config, prepared_ptb, tmp_path):
  share_prepared_ptb(prepared_ptb, tmp_path)
  seq_len, stride, batch_size, max_batches = 16, 4, 8, 3
  tiny_config.eval.seq_len, tiny_config.eval.stride, tiny_config.eval.batch_size = seq_len, stride, batch_size
  exp = loop.Experiment(tiny_config, tmp_path)
  assert exp.eval_mode() == {"mode": "sliding", "seq_len": 16, "stride": 4, "max_batches": 4}  # conftest's prefix
  params = exp.init_state().params
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))  # perturb, so the zero-initialised experts matter
  params = jax.tree.unflatten(treedef, [p + 0.05 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)])
  result = exp.evaluate(params, "valid", max_batches=max_batches)

  # The reference: one window at a time, scoring only the predictions no earlier window scored.
  stream = exp.data.stream("valid")
  apply = jax.jit(lambda p, x: exp.model.apply({"params": p}, x, np.array(False), deterministic=True).logits())
  nll, count, scored_up_to = 0.0, 0, 0  # predictions of input positions < scored_up_to are done
  for window in range(batch_size * max_batches):
    start = window * stride
    tokens = stream.read(start, start + seq_len + 1)
    logits = apply(params, tokens[None, :-1])
    per_token = np.asarray(token_nll(logits, tokens[None, 1:])[0])
    first_new = max(scored_up_to - start, 0)
    nll += float(per_token[first_new:].sum())
    count += seq_len - first_new
    scored_up_to = start + seq_len
  assert result["tokens"] == count == seq_len + (batch_size * max_batches - 1) * stride
  assert result["batches"] == max_batches
  np.testing.assert_allclose(result["loss"], nll / count, rtol=2e-6)


def test_stride_outside_the_window_is_refused(tiny_config):
  from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
  tiny_config.eval.stride = 17
  with pytest.raises(ConfigError, match=r"eval.stride=17 must lie in \[0, eval.seq_len=16\]"):
    validate_config(tiny_config)

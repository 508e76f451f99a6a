"""Values pinned by hand before the layers were moved (issue 23): each number here is worked out in the comments,
not taken from the code under test, so a changed constant (the smoothing amount, a step count off by one) fails."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

from stablemoe_jax.core.settings import TrainSettings, from_config
from stablemoe_jax.models.head import HeadInputs
from stablemoe_jax.tasks.translation import TranslationTask
from stablemoe_jax.train import losses
from stablemoe_jax.train.optimizer import learning_rate_schedule
from stablemoe_jax.train.schedules import inverse_sqrt_schedule

LN2 = math.log(2.0)
# Logits [0, 0, ln 2]: softmax [1/4, 1/4, 1/2], log-probabilities [-2 ln 2, -2 ln 2, -ln 2]. With smoothing 0.1 over
# V = 3 the labels are 0.1 / 3 on every class plus 0.9 on the target.
LOGITS = np.array([[[0.0, 0.0, LN2], [0.0, 0.0, LN2], [0.0, 0.0, LN2]]], np.float32)  # [1, 3, 3]
TARGETS = np.array([[2, 0, 1]], np.int32)
# target 2: (0.1/3)(2 ln 2) * 2 + (0.9 + 0.1/3)(ln 2)        = ln 2 * (0.4/3 + 0.9 + 0.1/3) = ln 2 * (0.9 + 0.5/3)
# target 0: (0.9 + 0.1/3)(2 ln 2) + (0.1/3)(2 ln 2) + (0.1/3)(ln 2) = ln 2 * (1.8 + 0.2/3 + 0.2/3 + 0.1/3) = ln 2 * (1.8 + 0.5/3)
SMOOTHED = [LN2 * (0.9 + 0.5 / 3), LN2 * (1.8 + 0.5 / 3), LN2 * (1.8 + 0.5 / 3)]
PLAIN = [LN2, 2 * LN2, 2 * LN2]  # -log p(target)


def test_label_smoothed_nll_matches_the_hand_computed_value():
  np.testing.assert_allclose(losses.label_smoothed_nll(jnp.asarray(LOGITS), jnp.asarray(TARGETS), 0.1)[0],
                             SMOOTHED, rtol=1e-6)
  np.testing.assert_allclose(losses.label_smoothed_nll(jnp.asarray(LOGITS), jnp.asarray(TARGETS), 0.0)[0],
                             PLAIN, rtol=1e-6)
  np.testing.assert_allclose(losses.token_nll(jnp.asarray(LOGITS), jnp.asarray(TARGETS))[0], PLAIN, rtol=1e-6)


def test_translation_train_loss_uses_the_configs_label_smoothing_and_weights():
  settings = from_config({"task": "translation", "train": {"label_smoothing": 0.1}})
  batch = {"targets": jnp.asarray(TARGETS), "weights": jnp.asarray([[1.0, 1.0, 0.0]], jnp.float32)}
  task = TranslationTask(settings)
  # The model's output whose logits are LOGITS: hidden states LOGITS against an identity embedding; the head on
  # whole logits (chunk_tokens 0) and in chunks of 2 tokens.
  for chunk_tokens in (0, 2):
    output = HeadInputs(jnp.asarray(LOGITS), jnp.eye(3, dtype=jnp.float32), 3, chunk_tokens)
    # The third position is padding (weight 0): the mean of the first two.
    assert float(task.train_loss(output, batch)) == pytest.approx((SMOOTHED[0] + SMOOTHED[1]) / 2, rel=1e-6)
    # Evaluation scores the plain NLL, summed.
    sums = task.eval_sums(output, batch)
    assert float(sums["nll_sum"]) == pytest.approx(PLAIN[0] + PLAIN[1], rel=1e-6)
    assert float(sums["tokens"]) == 2.0


# fairseq's inverse_sqrt with peak 1e-3 and 4 warmup steps, at optimizer update count c:
# c < 4: 1e-3 * c / 4; c >= 4: 1e-3 * sqrt(4 / c).
INVERSE_SQRT = {0: 0.0, 1: 2.5e-4, 2: 5e-4, 3: 7.5e-4, 4: 1e-3, 9: 1e-3 * 2 / 3, 16: 5e-4, 100: 2e-4, 400: 1e-4}


@pytest.mark.parametrize("count,expected", sorted(INVERSE_SQRT.items()))
def test_inverse_sqrt_schedule_at_given_steps(count, expected):
  assert float(inverse_sqrt_schedule(1e-3, 4)(count)) == pytest.approx(expected, rel=1e-6, abs=1e-12)
  train = TrainSettings(schedule="inverse_sqrt", learning_rate=1e-3, warmup_steps=4, steps=1000)
  assert float(learning_rate_schedule(train)(count)) == pytest.approx(expected, rel=1e-6, abs=1e-12)


# The language model's linear warmup and decay, peak 1e-3, 4 warmup steps of 12: up by 2.5e-4 a step to step 4,
# then down by 1e-3 / 8 a step to 0 at step 12.
LINEAR = {0: 0.0, 1: 2.5e-4, 4: 1e-3, 5: 1e-3 * 7 / 8, 8: 5e-4, 12: 0.0}


@pytest.mark.parametrize("count,expected", sorted(LINEAR.items()))
def test_linear_schedule_at_given_steps(count, expected):
  train = TrainSettings(schedule="linear", learning_rate=1e-3, warmup_steps=4, steps=12)
  assert float(learning_rate_schedule(train)(count)) == pytest.approx(expected, rel=1e-6, abs=1e-12)

"""The train, eval and routing-agreement steps on a model small enough to work out by hand.

The model is one scalar parameter ``w`` and two "MoE layers" that sow a balance loss, a z-loss and the
distillation metrics, so every number the steps return (the loss and its parts, the per-name sums over layers, the
gradient, its norm, the learning rate, the stage, the updated parameter, a microbatched step's average, the eval
sums and the agreement's mean over layers) is a closed form computed below, not by the code under test.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stablemoe_jax.core.settings import RunSettings, TrainSettings
from stablemoe_jax.experiment.step import make_eval_step, make_routing_agreement_step, make_train_step
from stablemoe_jax.models.routing import STATS, STATS_NAME, MoEStats, RouterLosses, RouterStats
from stablemoe_jax.train.state import TrainState

W0 = 2.0
BALANCE = (0.5, 1.5)  # per layer: balance loss = c * w, so its sum over layers is 2.0 * w
Z_LOSS = 0.25  # layer 0 only: z_loss = 0.25 * w^2
ACCURACY = (0.25, 0.75)  # each layer's router's distill_accuracy (mean 0.5)


class _Layer(nn.Module):
  balance: float
  z_loss: float
  accuracy: float

  @nn.compact
  def __call__(self, w):
    losses = RouterLosses(balance=self.balance * w, z_loss=self.z_loss * w * w if self.z_loss else None)
    zero = jnp.zeros(())
    self.sow(STATS, STATS_NAME, MoEStats(
        losses=losses, router=RouterStats(distill_accuracy=jnp.asarray(self.accuracy, jnp.float32)),
        load=jnp.ones((2,)) / 2, dropped_fraction=zero, mean_gate=w, low_gate_fraction=zero, load_entropy=zero,
        load_balance=zero, max_load=zero))
    return w


class _TinyModel(nn.Module):
  """``x [B] -> logits [B] = w * x``; layers moe_0 and moe_1 sow their stats (losses and metrics)."""

  sow_accuracy: bool = True

  @nn.compact
  def __call__(self, x, in_stage1, deterministic=True):
    del in_stage1, deterministic
    w = self.param("w", nn.initializers.constant(W0), ())
    if self.sow_accuracy:
      for i in range(2):
        _Layer(BALANCE[i], Z_LOSS if i == 0 else 0.0, ACCURACY[i], name=f"moe_{i}")(w)
    return w * x


class _MeanTask:
  """loss = mean(logits); eval sums: the logits' sum and their count."""

  def model_inputs(self, batch):
    return (batch["x"],)

  def model_keywords(self, batch):
    del batch
    return {}

  def train_loss(self, logits, batch):
    del batch
    return jnp.mean(logits)

  def eval_sums(self, logits, batch):
    del batch
    return {"nll_sum": jnp.sum(logits), "tokens": jnp.asarray(logits.size, jnp.float32)}


def _config(microbatches: int = 1) -> RunSettings:
  return RunSettings(seed=0, train=TrainSettings(stage1_steps=3, microbatches=microbatches, learning_rate=0.1,
                                                 warmup_steps=2, steps=10))


def _state(tx):
  params = {"w": jnp.asarray(W0, jnp.float32)}
  return TrainState(step=jnp.asarray(1, jnp.int32), params=params, opt_state=tx.init(params))


X = np.array([1.0, 2.0, 3.0, 6.0], np.float32)


def test_train_step_loss_parts_gradient_and_update_by_hand():
  tx = optax.sgd(0.5)
  state, metrics = jax.jit(make_train_step(_TinyModel(), tx, _config(), _MeanTask()))(_state(tx), {"x": X})
  # task = w * mean(x) = 2 * 3 = 6; balance = (0.5 + 1.5) * w = 4; z_loss = 0.25 * w^2 = 1; loss = 11.
  # d loss / dw = mean(x) + 2.0 + 0.5 * w = 3 + 2 + 1 = 6; sgd(0.5): w = 2 - 3 = -1.
  np.testing.assert_allclose(float(metrics["task_loss"]), 6.0, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["aux/balance"]), 4.0, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["aux/z_loss"]), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["loss"]), 11.0, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["grad_norm"]), 6.0, rtol=1e-6)
  np.testing.assert_allclose(float(state.params["w"]), -1.0, rtol=1e-6)
  # Step 1 of a 2-step warmup to 0.1: 0.05; step 1 < stage1_steps = 3: stage 1.
  np.testing.assert_allclose(float(metrics["learning_rate"]), 0.05, rtol=1e-6)
  assert int(metrics["stage"]) == 1 and int(state.step) == 2
  # Each layer's metrics under its own path, not summed.
  np.testing.assert_allclose(float(metrics["moe/moe_0/router/distill_accuracy"]), 0.25)
  np.testing.assert_allclose(float(metrics["moe/moe_1/router/distill_accuracy"]), 0.75)
  np.testing.assert_allclose(float(metrics["moe/moe_1/mean_gate"]), 2.0)
  assert sorted(k for k in metrics if k.startswith("aux/")) == ["aux/balance", "aux/z_loss"]


def test_microbatched_step_averages_gradients_and_metrics_by_hand():
  tx = optax.sgd(0.5)
  # Microbatch m takes rows m, m + 2: x = [1, 3] (mean 2) and [2, 6] (mean 4). Gradients 2 + 3 = 5 and 4 + 3 = 7,
  # averaged: 6 (the same as one batch: the loss is linear in the rows' mean); task losses 4 and 8, mean 6.
  state, metrics = jax.jit(make_train_step(_TinyModel(), tx, _config(microbatches=2), _MeanTask()))(
      _state(tx), {"x": X})
  np.testing.assert_allclose(float(metrics["task_loss"]), 6.0, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["grad_norm"]), 6.0, rtol=1e-6)
  np.testing.assert_allclose(float(state.params["w"]), -1.0, rtol=1e-6)


def test_stage_two_after_stage1_steps():
  tx = optax.sgd(0.5)
  state = _state(tx).replace(step=jnp.asarray(3, jnp.int32))
  _, metrics = jax.jit(make_train_step(_TinyModel(), tx, _config(), _MeanTask()))(state, {"x": X})
  assert int(metrics["stage"]) == 2
  # Step 3: decay from 0.1 at step 2 to 0 at step 10: 0.1 * (1 - 1/8).
  np.testing.assert_allclose(float(metrics["learning_rate"]), 0.0875, rtol=1e-6)


def test_eval_step_sums_by_hand():
  sums = jax.jit(make_eval_step(_TinyModel(), _MeanTask()))({"w": jnp.asarray(W0)}, {"x": X})
  assert float(sums["nll_sum"]) == pytest.approx(W0 * X.sum())
  assert float(sums["tokens"]) == 4.0


def test_routing_agreement_is_the_mean_over_layers():
  params = {"w": jnp.asarray(W0)}
  agreement = make_routing_agreement_step(_TinyModel(), _MeanTask())(params, {"x": X})
  assert float(agreement) == pytest.approx(0.5)
  assert make_routing_agreement_step(_TinyModel(sow_accuracy=False), _MeanTask())(params, {"x": X}) is None

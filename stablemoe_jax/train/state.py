"""The train state. The training stage is a function of its step, nothing else."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct


class TrainState(struct.PyTreeNode):
  """Everything that changes during training.

  Attributes:
    step: int32 scalar, the number of updates applied.
    params: model parameters.
    opt_state: optimizer state.
  """

  step: jax.Array
  params: Any
  opt_state: optax.OptState


def in_stage1(step: jax.Array, stage1_steps: int) -> jax.Array:
  """bool scalar: step ``step`` is a stage-1 step (learns the routing)."""
  return step < stage1_steps


def create_train_state(model, tx: optax.GradientTransformation, seed: int, seq_len: int,
                       sharding: jax.sharding.Sharding | None = None) -> TrainState:
  """Initialises parameters and optimizer state under jit, placed with ``sharding``."""
  def init():
    tokens = jnp.zeros((1, seq_len), jnp.int32)
    params = model.init(jax.random.key(seed), tokens, jnp.array(True))["params"]
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params))
  return jax.jit(init, out_shardings=sharding)()

"""The train state. The training stage is a function of its step, nothing else."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from stablemoe_jax.parallel import sharding as sharding_lib


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


def _boxed_init(model, tx: optax.GradientTransformation, seed: int, seq_len: int, sample_inputs=None):
  """A function returning a fresh state whose leaves still carry their logical axis names.

  ``sample_inputs``: the model's arguments before ``in_stage1`` for ``init`` (a task's ``sample_inputs``);
  None: the language model's token ids [1, seq_len].
  """
  def init():
    inputs = sample_inputs if sample_inputs is not None else (jnp.zeros((1, seq_len), jnp.int32),)
    params = model.init(jax.random.key(seed), *inputs, jnp.array(True))["params"]
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params))
  return init


def train_state_shardings(model, tx: optax.GradientTransformation, seq_len: int, mesh: jax.sharding.Mesh,
                          sample_inputs=None):
  """NamedShardings of every leaf of the train state (optimizer state included), from the logical axes."""
  return sharding_lib.state_shardings(jax.eval_shape(_boxed_init(model, tx, 0, seq_len, sample_inputs)), mesh)


def create_train_state(model, tx: optax.GradientTransformation, seed: int, seq_len: int,
                       mesh: jax.sharding.Mesh | None = None, sample_inputs=None, shardings=None) -> TrainState:
  """Initialises parameters and optimizer state under jit, laid out over ``mesh`` (None: default device).

  ``sample_inputs``: see ``_boxed_init`` (None: the language model's). ``shardings``: the state's
  ``train_state_shardings`` on ``mesh`` when the caller has them (None: traced here).
  """
  init = _boxed_init(model, tx, seed, seq_len, sample_inputs)
  if mesh is None:
    return jax.jit(lambda: nn.unbox(init()))()
  if shardings is None:
    shardings = train_state_shardings(model, tx, seq_len, mesh, sample_inputs)
  return jax.jit(lambda: nn.unbox(init()), out_shardings=shardings)()

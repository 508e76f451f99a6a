"""Learning-rate schedules other than the language model's linear warmup and decay."""
from __future__ import annotations

import jax.numpy as jnp
import optax

SCHEDULES = ("linear", "inverse_sqrt")  # train.schedule


def inverse_sqrt_schedule(peak: float, warmup_steps: int) -> optax.Schedule:
  """fairseq's ``inverse_sqrt``: linear warmup from 0 to ``peak``, then ``peak * sqrt(warmup / step)``."""
  warmup = max(int(warmup_steps), 1)

  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    return jnp.where(count < warmup, peak * count / warmup, peak * jnp.sqrt(warmup / jnp.maximum(count, 1.0)))
  return schedule

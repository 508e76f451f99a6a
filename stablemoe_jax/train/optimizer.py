"""Adam with warmup + linear decay, global-norm clipping, and the stage-1 freeze of the distilled router.

``optax.multi_transform`` gives the distilled router's parameters their own
chain whose last step scales the update by 1 while ``count < stage1_steps``
and by exactly 0 from the stage-1 boundary on, inside the same compiled step.

Optionally (a deviation; off by default) the learned routers' own parameters -- the centroids, and the
cosine router's projection and temperature -- get a third chain: the same Adam with its learning rate
multiplied by ``train.router_lr_scale`` and by ``min(1, count / train.router_warmup_steps)``, a warmup of
the routing parameters alone on top of the shared schedule.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from stablemoe_jax.core.settings import TrainSettings
from stablemoe_jax.models.distill import DISTILLED_ROUTER_NAME
from stablemoe_jax.train.schedules import inverse_sqrt_schedule

TRAINED = "trained"
FROZEN_AFTER_STAGE1 = "frozen_after_stage1"
ROUTER = "router"  # a learned router's own parameters, with train.router_lr_scale / train.router_warmup_steps
ROUTER_MODULE = "router"  # the MoE layer's router module (models/moe.py -> routers.make_router)


def param_labels(params, separate_router: bool = False) -> dict:
  """Labels every leaf ``frozen_after_stage1`` if it lies under a distilled router; with ``separate_router``,
  ``router`` if it lies under a MoE layer's router module (and not its distilled router); else ``trained``."""
  def label(path, _):
    names = {getattr(key, "key", None) for key in path}
    if DISTILLED_ROUTER_NAME in names:
      return FROZEN_AFTER_STAGE1
    return ROUTER if separate_router and ROUTER_MODULE in names else TRAINED
  return jax.tree_util.tree_map_with_path(label, params)


def router_lr_multiplier(train: TrainSettings) -> optax.Schedule:
  """count -> ``train.router_lr_scale * min(1, count / train.router_warmup_steps)`` (no warmup if 0)."""
  scale, warmup = float(train.router_lr_scale), int(train.router_warmup_steps)
  if warmup <= 0:
    return lambda count: jnp.asarray(scale, jnp.float32)
  return lambda count: scale * jnp.minimum(1.0, jnp.asarray(count, jnp.float32) / warmup)


def separate_router_optimizer(train: TrainSettings) -> bool:
  """Whether the router's parameters get their own chain (only when a setting differs from the shared one, so the
  default's optimizer state and numerics are the same as without these settings)."""
  return train.router_lr_scale != 1.0 or train.router_warmup_steps > 0


def learning_rate_schedule(train: TrainSettings) -> optax.Schedule:
  """Linear warmup from 0 to ``learning_rate`` over ``warmup_steps``, then linear decay to 0 at ``steps``.

  ``train.schedule = "inverse_sqrt"`` (translation): the same warmup, then ``learning_rate * sqrt(warmup / step)``.
  """
  peak, warmup, total = train.learning_rate, train.warmup_steps, train.steps
  if train.schedule == "inverse_sqrt":
    return inverse_sqrt_schedule(peak, warmup)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup), optax.linear_schedule(peak, 0.0, total - warmup)],
      [warmup],
  )


def make_optimizer(train: TrainSettings) -> optax.GradientTransformation:
  """The full optimizer; ``update`` must be called once per train step (its counts are the step)."""
  schedule = learning_rate_schedule(train)
  stage1_steps = train.stage1_steps

  def adam():
    return optax.adam(schedule, b1=train.adam_b1, b2=train.adam_b2, eps=train.adam_eps)

  freeze_at_boundary = optax.scale_by_schedule(lambda count: (count < stage1_steps).astype(jnp.float32))
  transforms = {TRAINED: adam(), FROZEN_AFTER_STAGE1: optax.chain(adam(), freeze_at_boundary)}
  separate = separate_router_optimizer(train)
  if separate:
    multiplier = router_lr_multiplier(train)
    transforms[ROUTER] = optax.adam(lambda count: schedule(count) * multiplier(count), b1=train.adam_b1,
                                    b2=train.adam_b2, eps=train.adam_eps)
  return optax.chain(
      optax.clip_by_global_norm(train.clip_norm),
      optax.multi_transform(transforms, lambda params: param_labels(params, separate)),
  )

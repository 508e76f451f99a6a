"""The device mesh ``(data, expert)`` over every device of every process, its checks, and per-process batches.

``mesh.expert`` devices share the experts (E / mesh.expert each); ``data`` takes the remaining
devices, each holding a replica of the experts. The batch is split over both axes, each process
feeding the rows of its own devices. Routing groups keep a run's result independent of the layout:
``model.moe.num_groups = 0`` (one group per device) is resolved at launch (:func:`resolve_layout`) and the run
records the number it trained with, so a resumption or an evaluation on another layout routes the same way.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.parallel import sharding as sharding_lib


def resolve_layout(config, device_count: int, recorded_groups: int | None = None):
  """A copy of ``config`` with ``model.moe.num_groups = 0`` (automatic) replaced by a number of routing groups.

  The number is ``recorded_groups`` when the run being resumed or evaluated recorded one (its checkpoints' config),
  so it routes exactly as it trained whatever the layout now; otherwise one group per device (``device_count``:
  every device of the mesh holds its own slice of the tokens, data x expert). A non-zero value is kept as given
  (a checkpoint written with another one is refused when it is restored).
  """
  if settings_lib.typed(settings_lib.ModelSettings, config.model).moe.num_groups != 0:
    return config
  config = type(config)(config.to_dict())
  config.model.moe.num_groups = int(recorded_groups) if recorded_groups else int(device_count)
  return config


def check_layout(config, device_count: int) -> None:
  """Raises ConfigError unless ``mesh.expert``, ``model.moe.num_groups`` and the batches fit ``device_count``.

  ``model.moe.num_groups = 0`` (one group per device, :func:`resolve_layout`) fits any ``device_count``."""
  expert = config.mesh.expert
  if expert < 1 or device_count % expert:
    raise ConfigError(f"mesh.expert={expert} must divide the number of devices ({device_count}); "
                      f"set --config.mesh.expert to a divisor of {device_count}.")
  for what, rows in (("train.batch_size / train.microbatches", config.train.batch_size // config.train.microbatches),
                     ("eval.batch_size", config.eval.batch_size)):
    if rows % device_count:
      raise ConfigError(f"{what}={rows} must be a multiple of the number of devices ({device_count}), "
                        f"so every device gets whole rows; change it or the device count.")
  moe = config.model.moe
  if moe.enabled and moe.num_groups % device_count:
    raise ConfigError(f"model.moe.num_groups={moe.num_groups} must be a multiple of the {device_count} devices "
                      f"that split the tokens (mesh data x expert); set --config.model.moe.num_groups to a "
                      f"multiple of {device_count} (it changes the routing, so keep it fixed across layouts).")


def make_mesh(mesh_config, devices: list | None = None) -> Mesh:
  """Mesh ``(data, expert)`` of shape ``(devices / mesh.expert, mesh.expert)`` over all processes' devices.

  Built with ``jax.sharding.Mesh`` (Auto axes): ``jax.make_mesh``'s Explicit axes break Linen ``init``.
  """
  devices = np.asarray(jax.devices() if devices is None else devices)
  return Mesh(devices.reshape(-1, mesh_config.expert), sharding_lib.MESH_AXES)


def under_mesh(mesh: Mesh, fn: Callable) -> Callable:
  """``fn`` called inside ``jax.set_mesh(mesh)``, so the MoE layers trace their dispatch for this mesh."""
  def call(*args, **kwargs):
    with jax.set_mesh(mesh):
      return fn(*args, **kwargs)
  return call


def to_global(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """This process's rows [B / processes, ...] -> global arrays [B, ...] split over the token axes."""
  sharding = sharding_lib.batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def local_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """From a batch every process holds whole, the rows this process feeds."""
  index, count = jax.process_index(), jax.process_count()
  return {k: np.split(v, count)[index] for k, v in batch.items()}


def global_batches(batches: Iterable[dict[str, np.ndarray]], mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
  """Whole batches read identically by every process -> sharded global arrays."""
  for batch in batches:
    yield to_global(local_rows(batch), mesh)


def barrier(name: str) -> None:
  """Waits for every process (a no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)

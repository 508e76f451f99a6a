"""Data parallelism over every device of every process: a 1-D ``data`` mesh.

The train state is replicated; each batch is split along its first axis, each
process feeding the rows of its own devices. Routing still sees the global
batch (XLA partitions the dispatch), so a sharded run computes what a
single-device run does. Expert parallelism (experts split over devices, an
all-to-all in the dispatch) replaces the dispatcher, not this module.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stablemoe_jax.config_validation import ConfigError

DATA_AXIS = "data"


def make_mesh() -> Mesh:
  """A 1-D mesh over all devices of all processes."""
  return Mesh(np.asarray(jax.devices()), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows of a batch split over the ``data`` axis."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def check_batch_divides(batch_size: int, what: str, mesh: Mesh) -> None:
  """Raises ConfigError unless ``batch_size`` rows split evenly over the mesh's devices."""
  if batch_size % mesh.size:
    raise ConfigError(f"{what}={batch_size} must be a multiple of the number of devices ({mesh.size}).")


def to_global(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """This process's rows [B / processes, ...] -> global arrays [B, ...] sharded over ``data``."""
  sharding = batch_sharding(mesh)
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

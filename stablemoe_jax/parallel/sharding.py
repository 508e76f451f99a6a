"""Logical axis names, the one rules table mapping them to mesh axes, and every sharding derived from it.

Parameters declare logical axes where they are created (``nn.with_logical_partitioning``; today only
the experts' leading ``expert`` axis); unannotated leaves are replicated. The train state's
shardings (optimizer state included, which mirrors the parameters), the batch's and evaluation's
all come from :data:`LOGICAL_AXIS_RULES` through the functions here.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"
EXPERT_AXIS = "expert"
MESH_AXES = (DATA_AXIS, EXPERT_AXIS)

# Logical names used in this code base.
BATCH = "batch"      # rows of a batch (and routing groups): split over every device
EXPERTS = "experts"  # the leading axis of every expert parameter

# logical name -> mesh axes. Expert weights are split over `expert` and replicated over `data`.
LOGICAL_AXIS_RULES = (
    (BATCH, MESH_AXES),
    (EXPERTS, EXPERT_AXIS),
)


def token_axes(mesh) -> tuple[str, ...]:
  """The mesh axes that split tokens (rows and routing groups), as the rules table says."""
  return tuple(a for a in dict(LOGICAL_AXIS_RULES)[BATCH] if a in mesh.axis_names)


def state_shardings(abstract_boxed_state: Any, mesh: Mesh) -> Any:
  """Shardings of a train state (or any pytree) from its abstract, still boxed value (``jax.eval_shape`` of
  its init): leaves boxed by ``with_logical_partitioning`` follow the rules table, the others are replicated."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_boxed_state), mesh, LOGICAL_AXIS_RULES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows of a batch [B, ...] split over every token-sharding axis."""
  return nn.logical_to_mesh_sharding(PartitionSpec(BATCH), mesh, LOGICAL_AXIS_RULES)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())

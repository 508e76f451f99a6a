"""The MoE layer: route -> slots per routing group -> dispatch -> experts -> combine, with a residual gate."""
from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from stablemoe_jax.models import dispatch, experts, routers
from stablemoe_jax.models.routing import METRICS, ROUTING, expert_load, masked_mean, routing_health

SHUFFLE_RNG = "shuffle"  # the rng stream of the token shuffle before capacity (given by the train step)


def mesh_devices() -> int:
  """Devices of the mesh set by the surrounding ``jax.set_mesh`` (1 outside one)."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty else int(mesh.size)


def with_groups(moe_config, groups: int):
  """A copy of the ``model.moe`` config with ``num_groups = groups``."""
  config = ml_collections.ConfigDict(moe_config.to_dict())
  config.num_groups = groups
  return config


class MoELayer(nn.Module):
  """Top-1 MoE: ``h'_t = h_t + gate_t * Expert_{e_t}(h_t)``; dropped tokens pass unchanged.

  The router runs on all T tokens (its losses are over the global batch). Tokens are then taken
  in ``model.moe.num_groups`` groups of T / G consecutive tokens with C = ``ceil(cf * T / G / E)``
  slots per (group, expert) (G = 0, which a launch resolves and records: one group per device of the surrounding
  mesh); in training (``deterministic=False``, ``shuffle_tokens`` on and a
  ``shuffle`` rng given) positions are assigned in a random order within each group. The
  dispatcher (``model.moe.dispatcher``) moves the rows to the experts and back; with "auto" it is
  the all-to-all one when the mesh of the surrounding ``jax.set_mesh`` has an ``expert`` axis > 1.
  Evaluation (``deterministic``) uses ``model.moe.eval_dispatcher``; its "auto" is the grouped
  dispatcher on the CPU when no token can be dropped (capacity = group size) and experts are not split
  over devices, so no-drop evaluation costs about the routed rows, not E times them (on a GPU, index).

  Attributes:
    moe_config: the ``model.moe`` config (router name and its settings, experts, capacity, groups).
    vocab_size: vocabulary size (for token-id routers).
    num_sublayers: FFN sublayers per expert.
    d_ff: expert FFN width.
    dropout: dropout inside the experts.
    dtype: computation dtype.
  """

  moe_config: Any
  vocab_size: int
  num_sublayers: int
  d_ff: int
  dropout: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, token_ids: jax.Array, in_stage1: jax.Array,
               deterministic: bool = True, token_mask: jax.Array | None = None) -> jax.Array:
    """x [B, S, d], token_ids int32 [B, S], in_stage1 bool scalar -> [B, S, d].

    ``token_mask`` bool [B, S] (None: every token is real): False marks padding, which takes no expert
    capacity, passes unchanged, and counts in no routing loss or metric.
    """
    cfg = self.moe_config
    if cfg.get("num_groups", 1) == 0:  # unresolved (a model built outside a launch): one group per device of the mesh
      cfg = with_groups(cfg, mesh_devices())
    num_experts = cfg.num_experts
    batch, length, d = x.shape
    h = x.reshape(batch * length, d)
    valid = None if token_mask is None else token_mask.reshape(-1)
    weights = None if valid is None else valid.astype(jnp.float32)
    routing = routers.make_router(cfg, vocab_size=self.vocab_size)(h, token_ids, in_stage1, deterministic,
                                                                   token_mask=weights)

    groups = 1 if self.is_initializing() else cfg.get("num_groups", 1)  # init's sample batch may be tiny
    if h.shape[0] % groups:
      raise ValueError(f"model.moe.num_groups={groups} must divide the {h.shape[0]} tokens of a batch.")
    group_size = h.shape[0] // groups
    capacity_factor = cfg.eval_capacity_factor if deterministic else cfg.capacity_factor
    capacity = dispatch.expert_capacity(group_size, num_experts, capacity_factor)
    shuffle = cfg.get("shuffle_tokens", False) and not deterministic and self.has_rng(SHUFFLE_RNG)
    slots = dispatch.group_slots(routing.expert_index.reshape(groups, group_size), num_experts, capacity,
                                 self.make_rng(SHUFFLE_RNG) if shuffle else None,
                                 None if valid is None else valid.reshape(groups, group_size))

    expert_params = experts.FFNExperts(num_experts, self.num_sublayers, self.d_ff,
                                        bias_init=cfg.get("expert_bias_init", "zeros"), name="experts")(d)
    dropout_rng = self.make_rng("dropout") if self.dropout > 0 and not deterministic else None
    expert_fn = functools.partial(experts.apply_ffn_experts, dropout=self.dropout, dtype=self.dtype)
    dispatcher = dispatch.choose_dispatcher(
        cfg.get("dispatcher", "auto"), eval_name=cfg.get("eval_dispatcher", "auto") if deterministic else None,
        no_drops=capacity == group_size, block_size=cfg.get("block_size", dispatch.DEFAULT_BLOCK_SIZE))
    expert_out = dispatcher(h.reshape(groups, group_size, d), slots, expert_params, dropout_rng,
                            expert_fn=expert_fn, num_experts=num_experts, capacity=capacity).reshape(-1, d)
    out = h + routing.gate[:, None].astype(h.dtype) * expert_out
    kept = slots.reshape(-1) < num_experts * capacity
    self.sow(METRICS, "load", expert_load(routing.expert_index, num_experts, weights))
    self.sow(METRICS, "dropped_fraction", 1.0 - masked_mean(kept.astype(jnp.float32), weights))
    # Router health (gate and load) every step; per-token routing only when ROUTING is mutable.
    for name, value in routing_health(routing.expert_index, routing.gate, num_experts, weights).items():
      self.sow(METRICS, name, value)
    self.sow(ROUTING, "expert_index", routing.expert_index)
    self.sow(ROUTING, "gate", routing.gate)
    return out.reshape(batch, length, d)

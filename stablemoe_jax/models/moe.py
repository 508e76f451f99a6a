"""The MoE layer: route -> dispatch -> experts -> combine, with a residual gate."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.models import dispatch, experts, routers
from stablemoe_jax.models.routing import METRICS, ROUTING, expert_load


class MoELayer(nn.Module):
  """Top-1 MoE: ``h'_t = h_t + gate_t * Expert_{e_t}(h_t)``; dropped tokens pass unchanged.

  Attributes:
    moe_config: the ``model.moe`` config (router name and its settings, experts, capacity).
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
               deterministic: bool = True) -> jax.Array:
    """x [B, S, d], token_ids int32 [B, S], in_stage1 bool scalar -> [B, S, d]."""
    cfg = self.moe_config
    batch, length, d = x.shape
    h = x.reshape(batch * length, d)
    routing = routers.make_router(cfg, vocab_size=self.vocab_size)(h, token_ids, in_stage1, deterministic)
    capacity_factor = cfg.eval_capacity_factor if deterministic else cfg.capacity_factor
    capacity = dispatch.expert_capacity(h.shape[0], cfg.num_experts, capacity_factor)
    dispatcher = dispatch.IndexDispatcher.create(routing.expert_index, cfg.num_experts, capacity)
    expert_out = experts.FFNExperts(
        cfg.num_experts, self.num_sublayers, self.d_ff, self.dropout, self.dtype, name="experts"
    )(dispatcher.dispatch(h), deterministic=deterministic)
    out = h + routing.gate[:, None].astype(h.dtype) * dispatcher.combine(expert_out)
    self.sow(METRICS, "load", expert_load(routing.expert_index, cfg.num_experts))
    self.sow(METRICS, "dropped_fraction", 1.0 - jnp.mean(dispatcher.kept.astype(jnp.float32)))
    # Routing analysis: confidence and balance every step; per-token routing only when ROUTING is mutable.
    self.sow(METRICS, "mean_gate", jnp.mean(routing.gate.astype(jnp.float32)))
    load = expert_load(routing.expert_index, cfg.num_experts)
    self.sow(METRICS, "load_entropy", jnp.sum(jax.scipy.special.entr(load)))  # nats; log N when balanced
    self.sow(ROUTING, "expert_index", routing.expert_index)
    self.sow(ROUTING, "gate", routing.gate)
    return out.reshape(batch, length, d)

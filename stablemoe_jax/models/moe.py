"""The MoE layer: route -> slots per routing group -> dispatch -> experts -> combine, with a residual gate.

Built by :func:`make_moe_layer` from explicit fields, each resolved once there: the router (``routers.make_router``,
passed in as ``MoELayer(router=...)``, flaxformer's pattern), the number of routing groups and the dispatchers (from
the mesh's facts, :class:`MeshFacts`); ``__call__`` reads no mesh. Each call sows one typed record,
``routing.MoEStats`` (the router's losses and stats, the layer's load and health), into ``routing.STATS``.

Shapes (the letters of ``models/__init__.py``)::

  x [B, S, d] -> h [T, d] (T = B * S) -> Routing: expert_index [T, k], gate [T, k]
  groups: [G, Tg] tokens (Tg = T / G; top-k: [G, k * Tg] choices), capacity C slots per (group, expert)
  slots [G, Tg] (``expert * C + position``, N * C: dropped) -> dispatcher -> expert rows [G, Tg, d]
  out = h + sum over the k choices of gate * expert output -> [B, S, d]
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.core.settings import MoESettings
from stablemoe_jax.models import dispatch, experts, routers
from stablemoe_jax.models.routing import ROUTING, STATS, STATS_NAME, MoEStats, expert_load, masked_mean, routing_health
from stablemoe_jax.parallel import sharding as sharding_lib

SHUFFLE_RNG = "shuffle"  # the rng stream of the token shuffle before capacity (given by the train step)


@dataclasses.dataclass(frozen=True)
class MeshFacts:
  """What a MoE layer needs of the device mesh, read once where it is built.

  Attributes:
    devices: devices of the mesh (1 without one): the routing groups of ``model.moe.num_groups = 0``.
    expert_devices: the mesh's ``expert`` axis (1 without one): which dispatchers apply.
  """

  devices: int = 1
  expert_devices: int = 1

  @classmethod
  def of_current_mesh(cls) -> "MeshFacts":
    """The facts of the mesh set by the surrounding ``jax.set_mesh`` (one device outside one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
      return cls()
    return cls(devices=int(mesh.size), expert_devices=int(mesh.shape.get(sharding_lib.EXPERT_AXIS, 1)))


def resolve_groups(moe: MoESettings, devices: int) -> MoESettings:
  """``moe`` with one group per device where its ``num_groups`` is 0 (unresolved: a model built outside a
  launch)."""
  return dataclasses.replace(moe, num_groups=devices) if moe.num_groups == 0 else moe


def make_moe_layer(moe: MoESettings, vocab_size: int, num_sublayers: int, d_ff: int, dropout: float = 0.0,
                   dtype: Any = jnp.float32, layer_cls=None, mesh: MeshFacts | None = None,
                   **kwargs) -> "MoELayer":
  """A MoE layer with its fields resolved once, here: what the models do.

  From ``moe`` (the ``model.moe`` section) and ``mesh`` (default: the facts of the surrounding ``jax.set_mesh``,
  read once): the routing groups (``num_groups`` 0: one a device), the router of ``moe.router``
  (``routers.make_router``) and the training and evaluation dispatchers (``dispatch.resolve_dispatchers``).

  ``layer_cls``: MoELayer (default) or a lifted version of it (``nn.remat(MoELayer, ...)``); ``kwargs``: Flax's
  (``name``).
  """
  mesh = MeshFacts.of_current_mesh() if mesh is None else mesh
  moe = resolve_groups(moe, mesh.devices)
  router = routers.make_router(moe, vocab_size=vocab_size)
  dispatchers = dispatch.resolve_dispatchers(moe.dispatcher, moe.eval_dispatcher, expert_devices=mesh.expert_devices,
                                             block_size=moe.block_size)
  return (layer_cls or MoELayer)(moe, vocab_size, num_sublayers, d_ff, dropout, dtype, router=router,
                                 dispatchers=dispatchers, **kwargs)


class MoELayer(nn.Module):
  """Top-k MoE: ``h'_t = h_t + sum_j gate_tj * Expert_{e_tj}(h_t)`` over the k choices of the router (k = 1:
  ``h_t + gate_t * Expert_{e_t}(h_t)``); a dropped choice adds nothing, a token with every choice dropped passes
  unchanged.

  The router runs on all T tokens (its losses are over the global batch). Tokens are then taken
  in ``moe.num_groups`` groups of T / G consecutive tokens with C = ``ceil(cf * T / G / N)``
  slots per (group, expert) (``model.moe.num_groups`` = 0, which a launch resolves and records: one group per
  device of the mesh); in training (``deterministic=False``, ``shuffle_tokens`` on and a
  ``shuffle`` rng given) positions are assigned in a random order within each group. The
  dispatcher (``model.moe.dispatcher``) moves the rows to the experts and back; with "auto" it is
  the all-to-all one when the mesh has an ``expert`` axis > 1.
  Evaluation (``deterministic``) uses ``model.moe.eval_dispatcher``; its "auto" is the grouped
  dispatcher on the CPU when no token can be dropped (capacity = group size) and experts are not split
  over devices, so no-drop evaluation costs about the routed rows, not N times them (on a GPU, index).
  Both are resolved where the layer is built (``dispatchers``).

  Top-k (``Routing.expert_index [T, k]``, k > 1): each of a token's k choices takes a slot of its expert's capacity
  (capacity counts choices, GShard's and MaxText's convention: ``ceil(cf * k * T / G / N)`` slots), filled in
  this order within a group: every token's first choice (in the group's order, shuffled or not), then every token's second choice, and so on, so a second
  choice never displaces a first one. Each choice is dispatched as a row of its own (the dispatchers see a group
  of k * T / G rows) and the layer sums the k gated outputs. The load metrics count choices; the gate metrics read
  the largest of a token's k gates (``routing.routing_health``).

  Each call sows one ``routing.MoEStats`` into ``routing.STATS`` (name "stats"): the router's ``losses`` and
  ``router`` stats as it returned them, the load [N], the dropped fraction and the routing health. Per-token routing
  (``expert_index`` / ``gate`` [T], top-k also ``expert_choices`` / ``gate_choices`` [T, k]) goes to
  ``routing.ROUTING``, kept only where a caller makes it mutable (the routing analysis).

  Shared experts (``model.moe.shared_experts = n > 0``, DeepSeekMoE): n more expert FFNs of the same shape
  (``shared_experts`` [n, ...], replicated, not split over expert devices) that every token goes through, ungated,
  whatever the router: ``h'_t = h_t + routed_t + sum_{i < n} Shared_i(h_t)``. Padding still passes unchanged.

  Attributes:
    moe: the ``model.moe`` settings (experts, capacity factors, shuffle, shared experts), its ``num_groups``
      resolved (> 0; ``make_moe_layer`` resolves 0 to one group per device of the mesh).
    vocab_size: vocabulary size (for token-id routers).
    num_sublayers: FFN sublayers per expert.
    d_ff: expert FFN width.
    dropout: dropout inside the experts.
    dtype: computation dtype.
    router: the router module, built by the model (``routers.make_router``, unbound) and adopted here as
      "router": ``router(h [T, d], token_ids, in_stage1, deterministic, token_mask=) -> Routing``.
    dispatchers: the training and evaluation dispatchers (``dispatch.resolve_dispatchers``).
  """

  moe: MoESettings
  vocab_size: int
  num_sublayers: int
  d_ff: int
  dropout: float = 0.0
  dtype: Any = jnp.float32
  router: Any = None
  dispatchers: dispatch.LayerDispatchers | None = None

  @nn.compact
  def __call__(self, x: jax.Array, token_ids: jax.Array, in_stage1: jax.Array,
               deterministic: bool = True, token_mask: jax.Array | None = None) -> jax.Array:
    """x [B, S, d], token_ids int32 [B, S], in_stage1 bool scalar -> [B, S, d].

    ``token_mask`` bool [B, S] (None: every token is real): False marks padding, which takes no expert
    capacity, passes unchanged, and counts in no routing loss or metric.
    """
    if self.router is None or self.dispatchers is None or self.moe.num_groups < 1:
      raise ValueError("MoELayer needs its router, dispatchers and routing groups resolved: build the layer with "
                       "moe.make_moe_layer(...).")
    cfg = self.moe
    num_experts = cfg.num_experts
    batch, length, d = x.shape
    h = x.reshape(batch * length, d)
    valid = None if token_mask is None else token_mask.reshape(-1)
    weights = None if valid is None else valid.astype(jnp.float32)
    routing = self.router(h, token_ids, in_stage1, deterministic, token_mask=weights)
    top_k = routing.top_k

    groups = 1 if self.is_initializing() else cfg.num_groups  # init's sample batch may be tiny
    if h.shape[0] % groups:
      raise ValueError(f"model.moe.num_groups={groups} must divide the {h.shape[0]} tokens of a batch.")
    group_size = h.shape[0] // groups
    capacity_factor = cfg.eval_capacity_factor if deterministic else cfg.capacity_factor
    capacity = capacity_lib.expert_capacity(group_size, num_experts, capacity_factor, top_k)
    shuffle = cfg.shuffle_tokens and not deterministic and self.has_rng(SHUFFLE_RNG)
    shuffle_rng = self.make_rng(SHUFFLE_RNG) if shuffle else None
    group_valid = None if valid is None else valid.reshape(groups, group_size)
    if top_k == 1:
      slots = capacity_lib.group_slots(routing.expert_index.reshape(groups, group_size), num_experts, capacity,
                                       shuffle_rng, group_valid)
    else:  # [G, k * Tg]: the choices choice-major (every first choice, then every second, ...), each a row
      slots = capacity_lib.choice_slots(routing.expert_index.reshape(groups, group_size, top_k), num_experts,
                                        capacity, shuffle_rng, group_valid
                                        ).swapaxes(1, 2).reshape(groups, top_k * group_size)

    expert_params = experts.FFNExperts(num_experts, self.num_sublayers, self.d_ff,
                                        bias_init=cfg.expert_bias_init, name="experts")(d)
    dropout_rng = self.make_rng("dropout") if self.dropout > 0 and not deterministic else None
    expert_fn = functools.partial(experts.apply_ffn_experts, dropout=self.dropout, dtype=self.dtype)
    dispatcher = self.dispatchers.pick(deterministic, no_drops=capacity == group_size)
    if top_k == 1:
      expert_index, gate = routing.expert_index[:, 0], routing.gate[:, 0]
      expert_out = dispatcher(h.reshape(groups, group_size, d), slots, expert_params, dropout_rng,
                              expert_fn=expert_fn, num_experts=num_experts, capacity=capacity).reshape(-1, d)
      out = h + gate[:, None].astype(h.dtype) * expert_out
      kept = slots.reshape(-1) < num_experts * capacity
    else:
      expert_index, gate = routing.expert_index, routing.gate
      rows = jnp.broadcast_to(h.reshape(groups, 1, group_size, d), (groups, top_k, group_size, d))
      expert_out = dispatcher(rows.reshape(groups, top_k * group_size, d), slots, expert_params, dropout_rng,
                              expert_fn=expert_fn, num_experts=num_experts, capacity=capacity)
      expert_out = expert_out.reshape(groups, top_k, group_size, d).swapaxes(1, 2).reshape(-1, top_k, d)
      out = h + jnp.sum(gate[..., None].astype(h.dtype) * expert_out, axis=1)
      kept = (slots.reshape(groups, top_k, group_size).swapaxes(1, 2).reshape(-1, top_k)
              < num_experts * capacity)  # [T, k]
    shared = cfg.shared_experts
    if shared > 0:  # DeepSeekMoE's shared experts: every token through each, added to the routed output
      shared_params = experts.FFNExperts(shared, self.num_sublayers, self.d_ff,
                                         bias_init=cfg.expert_bias_init, partitioned=False,
                                         name="shared_experts")(d)
      rows = jnp.broadcast_to(h[None, None], (shared, 1, *h.shape))  # [n, 1, T, d]: one "group" of all T tokens
      shared_out = expert_fn(shared_params, rows, num_experts + jnp.arange(shared), jnp.zeros((1,), jnp.int32),
                             dropout_rng)  # dropout keys: expert ids after the routed ones
      shared_out = jnp.sum(shared_out[:, 0], axis=0)
      out = out + (shared_out if valid is None else jnp.where(valid[:, None], shared_out, 0))
    dropped = 1.0 - masked_mean(kept.astype(jnp.float32),
                                weights if weights is None or top_k == 1 else weights[:, None])
    self.sow(STATS, STATS_NAME, MoEStats(
        losses=routing.losses, router=routing.stats, load=expert_load(expert_index, num_experts, weights),
        dropped_fraction=dropped, **routing_health(expert_index, gate, num_experts, weights)))
    # The first (highest-ranked) choice as ``expert_index`` / ``gate`` [T] (what the routing analysis reads);
    # with k > 1 every choice too, [T, k].
    self.sow(ROUTING, "expert_index", routing.expert_index[:, 0])
    self.sow(ROUTING, "gate", routing.gate[:, 0])
    if top_k > 1:
      self.sow(ROUTING, "expert_choices", routing.expert_index)
      self.sow(ROUTING, "gate_choices", routing.gate)
    return out.reshape(batch, length, d)

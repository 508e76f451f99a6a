"""Moving tokens to the experts and back: the dispatchers, and the rule that chooses one.

A dispatcher is one function with the signature of :data:`Dispatcher`:
``(x [G, Tg, d], slots [G, Tg], expert_params, rng, *, expert_fn, num_experts, capacity) -> [G, Tg, d]``.
The slots are each token's place in its group's capacity buffers (``capacity.py``: ``expert * C + position``,
``N * C`` for a dropped token, which gets zeros back). A dispatcher places the tokens into buffers, calls
``expert_fn(params, buffers [N', G', C, d], expert_ids [N'], group_ids [G'], rng)`` and brings the rows back in
token order:

- ``index``: scatter / gather by slot on one device (or under GSPMD);
- ``all_to_all``: the same per device under ``jax.shard_map``, with one tiled all-to-all over the
  mesh's ``expert`` axis each way, so each device runs only its own experts;
- ``grouped`` (``grouped_dispatch.py``): the same slots as ``index``, but the kept tokens of all groups on
  expert-sorted rows padded per expert to a block of b rows, each block through its own expert: about the routed
  rows' FLOPs instead of ``N * C`` rows per group (the CPU's evaluation default when nothing is dropped; on a
  GPU its block loop is far slower than ``index``);
- ``one_hot``: GShard's dense ``[T, N, C]`` mask einsum, kept for the benchmark only.
Nothing of shape ``[T, N, C]`` is built by the others; they move rows with ``buffers.py``. Which one a layer
uses: :func:`resolve_dispatcher_name`, applied once where the layer is built (:func:`resolve_dispatchers`).
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from stablemoe_jax.models.buffers import gather_from_buffers, scatter_to_buffers
from stablemoe_jax.models.grouped_dispatch import DEFAULT_BLOCK_SIZE, grouped_dispatch
from stablemoe_jax.parallel import sharding as sharding_lib

ExpertFn = Callable[..., jax.Array]


class Dispatcher(Protocol):
  def __call__(self, x: jax.Array, slots: jax.Array, expert_params: Any, rng: jax.Array | None, *,
               expert_fn: ExpertFn, num_experts: int, capacity: int) -> jax.Array: ...


def index_dispatch(x, slots, expert_params, rng, *, expert_fn, num_experts, capacity):
  """Scatter / gather by slot, all experts on this device (or partitioned by GSPMD)."""
  groups = x.shape[0]
  buffers = jax.vmap(scatter_to_buffers, in_axes=(0, 0, None, None))(x, slots, num_experts, capacity)
  y = expert_fn(expert_params, buffers.swapaxes(0, 1), jnp.arange(num_experts), jnp.arange(groups), rng)
  return jax.vmap(gather_from_buffers)(y.swapaxes(0, 1), slots)


def one_hot_dispatch(x, slots, expert_params, rng, *, expert_fn, num_experts, capacity):
  """GShard-style dispatch through a dense ``[G, Tg, N, C]`` mask (for the benchmark only)."""
  groups, group_size = slots.shape
  mask = jax.nn.one_hot(slots, num_experts * capacity + 1, dtype=x.dtype)[..., :-1]
  mask = mask.reshape(groups, group_size, num_experts, capacity)
  buffers = jnp.einsum("gtec,gtd->egcd", mask, x)
  y = expert_fn(expert_params, buffers, jnp.arange(num_experts), jnp.arange(groups), rng)
  return jnp.einsum("gtec,egcd->gtd", mask, y)


def all_to_all_dispatch(x, slots, expert_params, rng, *, expert_fn, num_experts, capacity):
  """Expert parallelism under ``jax.shard_map`` on the mesh of the current ``jax.set_mesh`` context.

  Per device: its G' = G / n_tokens groups -> ``[N, G', C, d]`` -> tiled all-to-all over ``expert``
  -> ``[N', n_expert * G', C, d]`` (N' = N / n_expert: every row its local experts get) -> the local
  experts as one batched matmul -> all-to-all back -> gather in token order.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if sharding_lib.EXPERT_AXIS not in mesh.axis_names:
    raise ValueError("the all_to_all dispatcher needs a mesh with an 'expert' axis: call the model under "
                     "jax.set_mesh(stablemoe_jax.parallel.mesh.make_mesh(...)).")
  n_expert = mesh.shape[sharding_lib.EXPERT_AXIS]
  local_experts = num_experts // n_expert
  token_axes = sharding_lib.token_axes(mesh)
  data_axes = tuple(a for a in token_axes if a != sharding_lib.EXPERT_AXIS)

  def local(x, slots, params, rng):
    groups_local = x.shape[0]
    buffers = jax.vmap(scatter_to_buffers, in_axes=(0, 0, None, None))(x, slots, num_experts, capacity)
    buffers = jax.lax.all_to_all(buffers.swapaxes(0, 1), sharding_lib.EXPERT_AXIS, 0, 1, tiled=True)
    expert_ids = jax.lax.axis_index(sharding_lib.EXPERT_AXIS) * local_experts + jnp.arange(local_experts)
    # Rows arrive ordered (source device along `expert`, its local group); name their global groups.
    data_index = jax.lax.axis_index(data_axes) if data_axes else 0
    sources = data_index * n_expert + jnp.arange(n_expert)
    group_ids = (sources[:, None] * groups_local + jnp.arange(groups_local)).reshape(-1)
    y = expert_fn(params, buffers, expert_ids, group_ids, rng)
    y = jax.lax.all_to_all(y, sharding_lib.EXPERT_AXIS, 1, 0, tiled=True)  # [N, G', C, d]
    return jax.vmap(gather_from_buffers)(y.swapaxes(0, 1), slots)

  params_spec = jax.tree.map(lambda _: P(sharding_lib.EXPERT_AXIS), expert_params)
  return jax.shard_map(local, in_specs=(P(token_axes), P(token_axes), params_spec, P()),
                       out_specs=P(token_axes), check_vma=True)(x, slots, expert_params, rng)


DISPATCHERS: dict[str, Dispatcher] = {
    "index": index_dispatch,
    "all_to_all": all_to_all_dispatch,
    "one_hot": one_hot_dispatch,
    "grouped": grouped_dispatch,
}
DISPATCHER_NAMES = ("auto", *DISPATCHERS)
SINGLE_DEVICE_DISPATCHERS = ("grouped",)  # no expert parallelism: refused when the mesh's expert axis is > 1


def _expert_devices() -> int:
  """Devices the experts are split over: the ``expert`` axis of the surrounding ``jax.set_mesh`` (1 outside one)."""
  return jax.sharding.get_abstract_mesh().shape.get(sharding_lib.EXPERT_AXIS, 1)


def resolve_dispatcher_name(name: str, *, eval_name: str | None = None, no_drops: bool = False,
                            backend: str | None = None, expert_devices: int | None = None) -> str:
  """The dispatcher a layer uses: ``model.moe.dispatcher`` (``name``), or in evaluation ``eval_name``.

  ``name`` "auto": all_to_all when the mesh's ``expert`` axis is > 1, else index. ``eval_name`` "auto":
  grouped when evaluation drops no token (``no_drops``), there is no expert axis > 1 and the backend
  (default: JAX's) is the CPU, else as training. On a GPU the grouped dispatcher's block loop ran 6-18x
  slower than index dispatch at capacity factor 1 and 2 (H100, lm_base and lm_large layer shapes,
  ``benchmarks/results/gpu/``), so there no-drop evaluation keeps index dispatch. ``expert_devices``: the mesh's
  ``expert`` axis (default: the surrounding mesh's).
  """
  expert_devices = _expert_devices() if expert_devices is None else expert_devices
  experts_split = expert_devices > 1
  if eval_name is not None and eval_name != "auto":
    name = eval_name
  elif eval_name == "auto" and no_drops and not experts_split and (backend or jax.default_backend()) == "cpu":
    name = "grouped"
  if name == "auto":
    name = "all_to_all" if experts_split else "index"
  if name not in DISPATCHERS:
    raise ValueError(f"unknown dispatcher {name!r}; choose one of {DISPATCHER_NAMES}")
  if name in SINGLE_DEVICE_DISPATCHERS and experts_split:
    raise ValueError(f"the {name} dispatcher has no expert parallelism, but the mesh's expert axis is "
                     f"{expert_devices}; use dispatcher all_to_all (or auto), or mesh.expert=1.")
  return name


def choose_dispatcher(name: str, *, eval_name: str | None = None, no_drops: bool = False,
                      block_size: int = DEFAULT_BLOCK_SIZE, expert_devices: int | None = None) -> Dispatcher:
  """``model.moe.dispatcher`` (and in evaluation ``model.moe.eval_dispatcher``) -> a dispatcher.

  See :func:`resolve_dispatcher_name`; ``block_size`` is the grouped dispatcher's row block.
  """
  return by_name(resolve_dispatcher_name(name, eval_name=eval_name, no_drops=no_drops,
                                         expert_devices=expert_devices), block_size)


def by_name(name: str, block_size: int = DEFAULT_BLOCK_SIZE) -> Dispatcher:
  """The dispatcher called ``name`` (one of ``DISPATCHERS``); ``block_size``: the grouped dispatcher's row block."""
  if name == "grouped":
    return functools.partial(grouped_dispatch, block_size=block_size)
  return DISPATCHERS[name]


@dataclasses.dataclass(frozen=True)
class LayerDispatchers:
  """The dispatchers of one MoE layer, resolved once where it is built (:func:`resolve_dispatchers`): names in
  ``DISPATCHERS``.

  Attributes:
    train: training's.
    eval: evaluation's when a token can be dropped.
    eval_no_drops: evaluation's when none can (capacity = group size).
    block_size: the grouped dispatcher's row block.
  """

  train: str
  eval: str
  eval_no_drops: str
  block_size: int = DEFAULT_BLOCK_SIZE

  def pick(self, deterministic: bool, no_drops: bool) -> Dispatcher:
    """The dispatcher of a call: evaluation's (``deterministic``) by whether it can drop a token, else training's."""
    name = (self.eval_no_drops if no_drops else self.eval) if deterministic else self.train
    return by_name(name, self.block_size)


def resolve_dispatchers(name: str, eval_name: str, *, expert_devices: int, block_size: int = DEFAULT_BLOCK_SIZE,
                        backend: str | None = None) -> LayerDispatchers:
  """``model.moe.dispatcher`` and ``eval_dispatcher`` resolved (:func:`resolve_dispatcher_name`) for experts split
  over ``expert_devices`` devices and ``backend`` (default: JAX's)."""
  resolve = functools.partial(resolve_dispatcher_name, backend=backend, expert_devices=expert_devices)
  return LayerDispatchers(train=resolve(name), eval=resolve(name, eval_name=eval_name),
                          eval_no_drops=resolve(name, eval_name=eval_name, no_drops=True), block_size=block_size)

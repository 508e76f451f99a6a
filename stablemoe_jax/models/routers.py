"""Routing methods, looked up by name in ``ROUTERS``: the one registry of every router family.

Every router is a Flax module called as
``router(h [T, d], token_ids int32 [B, S] (or [T]), in_stage1 bool scalar, deterministic bool,
token_mask=None) -> Routing`` (T = B * S; ``deterministic`` is false only in training; ``token_mask``
float32 [T], 1 for a real token and 0 for padding, which then counts in no loss and no metric). Its settings are the
config section ``model.moe.<name>``; auxiliary losses are sown into ``aux_loss``
under their own names and logged by the train step as ``aux/<name>``.

The learned routers share one module, ``learned_router.LearnedRouter``: affinities
``s = h E^T`` (float32) to per-expert centroids E, a *policy* that turns them
into an assignment, a gate and losses, and optionally the two-stage procedure
of StableMoE (distil the learned assignment into a token-id-only router during
``train.stage1_steps``, then freeze that router and route by it). One module per family:

- ``stablemoe`` (``stablemoe_router.py``): greedy top-1, sigmoid gate, StableMoE balance loss, always two-stage;
- ``switch`` (``switch_router.py``): greedy top-1 on softmax probabilities, gate = that probability,
  load-balancing loss ``N * sum_i f_i P_i`` (optional z-loss and input jitter);
- ``base`` (``base_router.py``): balanced assignment in training (auction, ``balanced_assignment.py``),
  greedy at inference, sigmoid gate, no loss;
- ``switch`` and ``base`` with ``fixed_routing=True``: the same two stages (Table 5);
- ``hash`` (``hash_router.py``): routes by a fixed token-id -> expert table.

A new method: a module of its own with a router module (or a policy of ``LearnedRouter``), its ``build``, ``check``
and default settings, an entry in ``ROUTERS``, and its config section.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import numpy as np

from stablemoe_jax.models import base_router, hash_router, stablemoe_router, switch_router


@dataclasses.dataclass(frozen=True)
class RouterEntry:
  """A routing method.

  Attributes:
    build: (settings, *, moe_config, num_experts, vocab_size) -> the router module, named "router".
    defaults: the default settings (must equal the section ``model.moe.<name>`` of configs/default.py).
    check: (settings, moe_config) -> problems, one message each naming the key and the fix.
    uses_distilled_router: whether the shared section ``model.moe.distilled_router`` applies.
    fill_from_data: optional (router params, settings, num_experts, token_counts) -> router params, run once at
      initialisation with the training split's token counts [V].
    preset_keys: settings a preset may change from ``defaults`` while another router is chosen (they are then
      unused): the CPU presets turn on small-scale deviations this way, and ``--config.model.moe.router=X``
      still works on them.
  """

  build: Callable[..., nn.Module]
  defaults: dict
  check: Callable[[Any, Any], list[str]]
  uses_distilled_router: Callable[[Any], bool] = lambda settings: False
  fill_from_data: Callable[..., dict] | None = None
  preset_keys: tuple[str, ...] = ()


ROUTERS: dict[str, RouterEntry] = {
    "stablemoe": RouterEntry(
        stablemoe_router.build, stablemoe_router.DEFAULTS, stablemoe_router.check,
        uses_distilled_router=lambda s: True, preset_keys=stablemoe_router.PRESET_KEYS),
    "switch": RouterEntry(
        switch_router.build, switch_router.DEFAULTS, switch_router.check,
        uses_distilled_router=lambda s: s.fixed_routing, preset_keys=switch_router.PRESET_KEYS),
    "base": RouterEntry(
        base_router.build, base_router.DEFAULTS, base_router.check, uses_distilled_router=lambda s: s.fixed_routing),
    "hash": RouterEntry(hash_router.build, hash_router.DEFAULTS, hash_router.check,
                        fill_from_data=hash_router.fill_from_data),
}


def make_router(moe_config, *, vocab_size: int) -> nn.Module:
  """Builds the router named by ``moe_config.router`` from its own section ``moe_config[router]``."""
  name = moe_config.router
  if name not in ROUTERS:
    raise ValueError(f"unknown router {name!r}; choose one of {sorted(ROUTERS)}")
  return ROUTERS[name].build(moe_config[name], moe_config=moe_config, num_experts=moe_config.num_experts,
                             vocab_size=vocab_size)


def fill_tables_from_data(params: dict, model_config, token_counts: Callable[[], np.ndarray]) -> dict:
  """Applies the chosen router's ``fill_from_data`` to every MoE layer's router parameters.

  Args:
    params: the freshly initialised model parameters.
    model_config: the ``model`` config.
    token_counts: returns the training split's token counts, int [model.vocab_size] (called only if needed).
  """
  moe = model_config.moe
  entry = ROUTERS.get(moe.router)
  dense = model_config.get("dense_match", "none") != "none"
  if not moe.enabled or dense or entry is None or entry.fill_from_data is None:
    return params
  params = dict(params)
  for layer, layer_params in params.items():
    if "router" in getattr(layer_params, "keys", lambda: ())():
      params[layer] = {**layer_params, "router": entry.fill_from_data(
          layer_params["router"], moe[moe.router], moe.num_experts, token_counts)}
  return params

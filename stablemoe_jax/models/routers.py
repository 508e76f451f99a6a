"""Routing methods, looked up by name in ``ROUTERS``: the one registry of every router family.

Every router is a Flax module called as
``router(h [T, d], token_ids int32 [B, S] (or [T]), in_stage1 bool scalar, deterministic bool,
token_mask=None) -> Routing`` (T = B * S; ``deterministic`` is false only in training; ``token_mask``
float32 [T], 1 for a real token and 0 for padding, which then counts in no loss and no metric). Its settings are the
config section ``model.moe.<name>``. Its auxiliary losses and its own metrics travel in the ``Routing`` it returns,
as the typed records ``routing.RouterLosses`` (``Routing(..., losses=RouterLosses(balance=...))``; the train step
adds each to the loss and logs it as ``aux/<name>``) and ``routing.RouterStats`` (logged as
``moe/<layer>/router/<name>``).

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
- ``hash`` (``hash_router.py``): routes by a fixed token-id -> expert table;
- ``deepseek`` (``deepseek_router.py``): DeepSeek-V3's sigmoid top-k on affinity + a per-expert bias moved after
  every step toward balance (no auxiliary loss), gates the normalised affinities x ``routed_scale``.

A new method: a module of its own with a router module (or a policy of ``LearnedRouter``), its ``build``, ``check``
and default settings, an entry in ``ROUTERS``, and its config section. The entry holds every fact about the router
that code outside ``models/`` needs (the health verdict's gate range, a post-update hook, its losses, the cures a
collapse message names): nothing outside ``models/`` branches on a router's name.

The model builds the router (:func:`make_router`, unbound: ``parent=None``) and passes it into its MoE layer
(``MoELayer(router=...)``, flaxformer's pattern), which adopts it under the name "router".
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import numpy as np

from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.settings import MoESettings, ModelSettings
from stablemoe_jax.models import (base_router, cosine_routing, deepseek_router, hash_router, stablemoe_router,
                                  switch_router)

# What a router's gate is, which fixes the range it can reach (train/health.py's early warning): "sigmoid" of a
# score ((0, 1) for a dot product, [sigmoid(-1/tau), sigmoid(1/tau)] for a cosine one), "softmax" (the top choice's
# probability: [1/N, 1] for top-1, [1/k, 1] renormalised over k choices; DeepSeek's normalised affinities too),
# "fixed" (a constant gate: no range). ``RouterEntry.gate_scale`` multiplies the range (DeepSeek's routed_scale).
GATE_KINDS = ("sigmoid", "softmax", "fixed")


@dataclasses.dataclass(frozen=True)
class RouterEntry:
  """A routing method.

  Attributes:
    build: (settings, *, moe, num_experts, vocab_size) -> the router module, named "router".
    settings: the section ``model.moe.<name>`` as its frozen dataclass (``core/settings/routers.py``): its fields,
      types, defaults and descriptions; ``settings_lib.typed`` reads it from the config.
    check: (settings, moe) -> problems, one message each naming the key and the fix.
    uses_distilled_router: whether the shared section ``model.moe.distilled_router`` applies.
    fill_from_data: optional (router params, settings, num_experts, token_counts) -> router params, run once at
      initialisation with the training split's token counts [V].
    preset_keys: settings a preset may change from their absent value while another router is chosen (they are then
      unused): the CPU presets turn on small-scale deviations this way, and ``--config.model.moe.router=X``
      still works on them.
    gate_kind: (settings) -> one of ``GATE_KINDS``: what the gate is, so the range the health verdict places the
      mean gate in (train/health.py reads it here).
    gate_scale: (settings) -> the factor on the gate's range (1 but for DeepSeek's ``routed_scale``).
    top_k: (settings) -> k, the experts each token is routed to (``Routing.expert_index [T, k]``).
    post_update: optional (model settings) -> ``(params, stats) -> params`` or None: applied by the train step to
      the parameters after every optimizer update, with the step's ``{layer path: routing.MoEStats}`` (X-MoE's
      centroid rescale, ``cosine_routing.expert_norm_hook``; DeepSeek's bias update from each layer's ``load``,
      ``deepseek_router.bias_update_hook``).
    losses: the ``routing.RouterLosses`` fields the router may return (logged as ``aux/<name>``).
    collapse_cures: settings of this router a collapse message suggests first, before the generic cures.
    added_settings: settings added after checkpoints were written, each at the value that reproduces those runs
      (a checkpoint whose config lacks the key restores where it has this value; ``train/checkpoint.py``).
  """

  build: Callable[..., nn.Module]
  settings: type
  check: Callable[[Any, Any], list[str]]
  uses_distilled_router: Callable[[Any], bool] = lambda settings: False
  fill_from_data: Callable[..., dict] | None = None
  preset_keys: tuple[str, ...] = ()
  gate_kind: Callable[[Any], str] = lambda settings: "sigmoid"
  gate_scale: Callable[[Any], float] = lambda settings: 1.0
  top_k: Callable[[Any], int] = lambda settings: 1
  post_update: Callable[[Any], Callable[[dict], dict] | None] | None = None
  losses: tuple[str, ...] = ()
  collapse_cures: tuple[str, ...] = ()
  added_settings: dict = dataclasses.field(default_factory=dict)

  def unselected_changes(self, section) -> list[tuple[str, object]]:
    """(key, value) of each setting of ``section`` (this router's, typed) a config changed from the value it has
    when absent, other than the ``preset_keys``: settings that would be ignored while another router is chosen."""
    return [(f.name, getattr(section, f.name)) for f in dataclasses.fields(self.settings)
            if f.name not in self.preset_keys
            and getattr(section, f.name) != settings_lib.absent_value(self.settings, f.name)]


ROUTERS: dict[str, RouterEntry] = {
    "stablemoe": RouterEntry(
        stablemoe_router.build, settings_lib.StableMoESettings, stablemoe_router.check,
        uses_distilled_router=lambda s: True, preset_keys=stablemoe_router.PRESET_KEYS,
        post_update=cosine_routing.expert_norm_hook, losses=("balance", "z_loss", "distill"),
        collapse_cures=("--config.model.moe.stablemoe.balance_scope=all",)),
    "switch": RouterEntry(
        switch_router.build, settings_lib.SwitchSettings, switch_router.check,
        uses_distilled_router=lambda s: s.fixed_routing, preset_keys=switch_router.PRESET_KEYS,
        gate_kind=lambda s: "softmax", top_k=switch_router.top_k, post_update=cosine_routing.expert_norm_hook,
        losses=("balance", "z_loss", "distill"),
        added_settings=settings_lib.added_settings(settings_lib.SwitchSettings)),
    "base": RouterEntry(
        base_router.build, settings_lib.BaseSettings, base_router.check, uses_distilled_router=lambda s: s.fixed_routing,
        losses=("distill",)),
    "hash": RouterEntry(hash_router.build, settings_lib.HashSettings, hash_router.check,
                        fill_from_data=hash_router.fill_from_data, gate_kind=lambda s: "fixed"),
    "deepseek": RouterEntry(
        deepseek_router.build, settings_lib.DeepSeekSettings, deepseek_router.check, gate_kind=lambda s: "softmax",
        gate_scale=lambda s: float(s.routed_scale), top_k=deepseek_router.top_k,
        post_update=deepseek_router.bias_update_hook, losses=("balance",),
        added_settings=settings_lib.added_settings(settings_lib.DeepSeekSettings),
        collapse_cures=("a larger --config.model.moe.deepseek.bias_update_rate",)),
}


# ``model.moe`` keys added after checkpoints were written, at the value that reproduces those runs.
ADDED_MOE_SETTINGS = settings_lib.added_settings(MoESettings)


def without_added_settings(moe: dict) -> dict:
  """A ``model.moe`` config as a dict, less every key added after checkpoints were written (``ADDED_MOE_SETTINGS``,
  each router's ``added_settings``) that holds the value reproducing those runs: so a config written before the key
  existed compares equal to one at that value."""
  moe = dict(moe)
  for key, value in ADDED_MOE_SETTINGS.items():
    if key in moe and moe[key] == value:
      del moe[key]
  for name, entry in ROUTERS.items():
    if isinstance(moe[name] if name in moe else None, dict) and entry.added_settings:
      moe[name] = {k: v for k, v in moe[name].items() if k not in entry.added_settings or entry.added_settings[k] != v}
      if not moe[name] and (moe["router"] if "router" in moe else None) != name:  # added since, at its defaults
        del moe[name]
  return moe


def chosen(moe: MoESettings) -> tuple[RouterEntry, Any]:
  """The registry entry of ``moe.router`` and its settings (an ``entry.settings``)."""
  if moe.router not in ROUTERS:
    raise ValueError(f"unknown router {moe.router!r}; choose one of {sorted(ROUTERS)}")
  return ROUTERS[moe.router], moe.router_settings()


def gate_kind(moe: MoESettings) -> str:
  """What the chosen router's gate is (``GATE_KINDS``)."""
  entry, settings = chosen(moe)
  return entry.gate_kind(settings)


def gate_scale(moe: MoESettings) -> float:
  """The factor on the chosen router's gate range."""
  entry, settings = chosen(moe)
  return float(entry.gate_scale(settings))


def top_k(moe: MoESettings) -> int:
  """The experts each token is routed to by the chosen router."""
  entry, settings = chosen(moe)
  return int(entry.top_k(settings))


def collapse_cures(router: str) -> tuple[str, ...]:
  """The chosen router's own cures for a collapse (none for a name not in the registry)."""
  entry = ROUTERS.get(router)
  return entry.collapse_cures if entry is not None else ()


def post_update_hook(model: ModelSettings) -> Callable[[dict, dict], dict] | None:
  """The chosen router's ``post_update`` hook for this model (``(params, stats) -> params``), or None: no hook, a
  dense model, or no MoE layer. The train step applies it after every optimizer update."""
  entry = ROUTERS.get(model.moe.router)
  if not model.has_moe_layers or entry is None or entry.post_update is None:
    return None
  return entry.post_update(model)


def make_router(moe: MoESettings, *, vocab_size: int) -> nn.Module:
  """Builds the router named by ``moe.router`` from its own section (``moe.router_settings()``): an unbound module
  named "router" (``parent=None``), for the model to pass into a MoE layer (which adopts it) or to call on its
  own."""
  entry, settings = chosen(moe)
  return entry.build(settings, moe=moe, num_experts=moe.num_experts, vocab_size=vocab_size)


def fill_tables_from_data(params: dict, model: ModelSettings, token_counts: Callable[[], np.ndarray]) -> dict:
  """Applies the chosen router's ``fill_from_data`` to every MoE layer's router parameters.

  Args:
    params: the freshly initialised model parameters.
    model: the ``model`` settings.
    token_counts: returns the training split's token counts, int [model.vocab_size] (called only if needed).
  """
  moe = model.moe
  entry = ROUTERS.get(moe.router)
  if not model.has_moe_layers or entry is None or entry.fill_from_data is None:
    return params
  params = dict(params)
  for layer, layer_params in params.items():
    if "router" in getattr(layer_params, "keys", lambda: ())():
      params[layer] = {**layer_params, "router": entry.fill_from_data(
          layer_params["router"], moe.router_settings(), moe.num_experts, token_counts)}
  return params

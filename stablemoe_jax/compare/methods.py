"""The compared methods: each a name, a label and a set of ``model.*`` config overrides.

Every method trains under the run config's budget (steps, batch, sequence length, data, shared
layers); a method may only change ``model.*`` keys, so the budget is the same for all, and
``train.stage1_steps``, which splits that budget between the stages (the value ``"all"``: the whole run is
stage 1, the paper's "stage 1 only" ablation).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from stablemoe_jax.compare.comparison import Comparison
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config


@dataclasses.dataclass(frozen=True)
class Method:
  """A compared method: ``name`` on the command line, ``label`` in the table, ``overrides`` {dotted key: value}."""

  name: str
  label: str
  overrides: dict[str, Any]


_DOT = {"model.moe.stablemoe.affinity": "dot", "model.moe.stablemoe.cosine_dim": 0,
        "model.moe.stablemoe.cosine_expert_norm": 0.0}


def _cosine(router: str, expert_norm: float) -> dict:
  """X-MoE's cosine routing for ``router``: a 16-dim projection (X-MoE's), tau learned from 0.5, and the expert
  embeddings at the registry's init (``expert_norm`` 0: today's cosine routing, docs/tuning_log.md p03) or X-MoE's as
  published (1.5: orthogonal init, every row rescaled to norm 1.5 after each update; models/cosine_routing.py)."""
  section = f"model.moe.{router}"
  return {"model.moe.router": router, f"{section}.affinity": "cosine", f"{section}.cosine_dim": 16,
          f"{section}.cosine_temperature": 0.5, f"{section}.cosine_expert_norm": expert_norm}

STAGE1_KEY = "train.stage1_steps"  # the one train.* key a method may set: how the budget splits between the stages

# The one table of methods. Keys are config paths, as on the command line (--config.model.moe.router=switch).
METHODS = {m.name: m for m in [
    Method("stablemoe", "StableMoE", {"model.moe.router": "stablemoe"}),
    # The two balance-loss scopes as methods of their own, whatever the config's scope (README "Router health").
    # Both with the paper's dot-product routing, whatever the config's affinity.
    Method("stablemoe_assigned", "StableMoE, the paper's balance loss (assigned)",
           {"model.moe.router": "stablemoe", "model.moe.stablemoe.balance_scope": "assigned", **_DOT}),
    Method("stablemoe_all", "StableMoE, balance loss over all tokens (all)",
           {"model.moe.router": "stablemoe", "model.moe.stablemoe.balance_scope": "all", **_DOT}),
    # all + X-MoE's cosine routing on a 16-dim projection with a learned temperature (docs/tuning_log.md, probe p03).
    Method("stablemoe_cosine", "StableMoE, all, cosine routing (X-MoE)",
           {**_cosine("stablemoe", 0.0), "model.moe.stablemoe.balance_scope": "all"}),
    # ... with X-MoE's expert embeddings as published (issue 39): orthogonal, held at norm 1.5.
    Method("stablemoe_xmoe", "StableMoE, all, X-MoE routing as published (expert norm 1.5)",
           {**_cosine("stablemoe", 1.5), "model.moe.stablemoe.balance_scope": "all"}),
    Method("switch", "Switch Transformer", {"model.moe.router": "switch"}),
    # Switch with X-MoE's routing, which was designed for a softmax top-k router (issue 38): as stablemoe_cosine's,
    # and as published.
    Method("switch_cosine", "Switch Transformer, cosine routing (X-MoE)", _cosine("switch", 0.0)),
    Method("switch_xmoe", "Switch Transformer, X-MoE routing as published (expert norm 1.5)", _cosine("switch", 1.5)),
    # Routers after StableMoE (issue 52; configs/tune_routers_cpu.py asks them StableMoE's question): top-2 Switch
    # (Mixtral's renormalised softmax), DeepSeek-V3's bias-balanced sigmoid routing at top-2 of the 8 experts, and the
    # latter with one always-on shared expert (DeepSeekMoE).
    Method("switch_top2", "Switch Transformer, top-2", {"model.moe.router": "switch", "model.moe.switch.top_k": 2}),
    Method("deepseek", "DeepSeek-V3 routing, top-2 (sigmoid, bias-balanced)",
           {"model.moe.router": "deepseek", "model.moe.deepseek.top_k": 2}),
    Method("deepseek_shared", "DeepSeek-V3 routing, top-2, + 1 shared expert",
           {"model.moe.router": "deepseek", "model.moe.deepseek.top_k": 2, "model.moe.shared_experts": 1}),
    Method("base", "BASE Layer", {"model.moe.router": "base"}),
    Method("hash", "Hash Layer", {"model.moe.router": "hash"}),
    Method("base_fixed", "BASE Layer + fixed routing",
           {"model.moe.router": "base", "model.moe.base.fixed_routing": True}),
    # The paper's Table 5 ablation: StableMoE's routing learned for the whole run, never distilled and frozen.
    Method("stablemoe_cosine_stage1_only", "StableMoE, all, cosine routing, stage 1 only",
           {**_cosine("stablemoe", 0.0), "model.moe.stablemoe.balance_scope": "all", "train.stage1_steps": "all"}),
    Method("dense", "dense Transformer (same shared layers)", {"model.moe.enabled": False}),
    Method("dense_deeper", "dense deeper (MoE total params)", {"model.dense_match": "deeper"}),
    Method("dense_wider", "dense wider (MoE total params)", {"model.dense_match": "wider"}),
    Method("dense_flops", "dense, MoE FLOPs a token (one expert FFN where each MoE layer is)",
           {"model.dense_match": "flops"}),
]}


def parse_method_names(text: str) -> list[str]:
  """``'stablemoe, switch'`` -> ``['stablemoe', 'switch']``; unknown or repeated names are a ConfigError."""
  names = [name.strip() for name in str(text).split(",") if name.strip()]
  if not names:
    raise ConfigError(f"compare.methods is empty; give a comma-separated list of {', '.join(METHODS)}.")
  for name in names:
    if name not in METHODS:
      raise ConfigError(f"compare.methods: unknown method {name!r}; choose from {', '.join(METHODS)} "
                        f"(e.g. --config.compare.methods=stablemoe,dense).")
  if len(set(names)) != len(names):
    raise ConfigError(f"compare.methods={text!r} names a method twice.")
  return names


def apply_overrides(config: ml_collections.ConfigDict, method: Method) -> ml_collections.ConfigDict:
  """A copy of ``config`` with ``method``'s overrides set; a key the config lacks is a ConfigError."""
  config = ml_collections.ConfigDict(config.to_dict())
  for key, value in method.overrides.items():
    if key == STAGE1_KEY:
      config.train.stage1_steps = config.train.steps if value == "all" else int(value)
      continue
    if not key.startswith("model."):
      raise ConfigError(f"method {method.name!r} overrides {key}; methods may only change model.* keys (and "
                        f"{STAGE1_KEY}), so that every method trains under the same budget.")
    *parents, leaf = key.split(".")
    node = config
    for depth, part in enumerate(parents):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        raise ConfigError(f"method {method.name!r} sets {key}={value!r}, but the config has no section "
                          f"{'.'.join(parents[:depth + 1])}: this codebase does not offer that method yet "
                          f"(leave it out of --config.compare.methods).")
      node = node[part]
    if leaf not in node:
      raise ConfigError(f"method {method.name!r} sets {key}={value!r}, but the config has no key {key}: this "
                        f"codebase does not offer that method yet (leave it out of --config.compare.methods).")
    try:
      node[leaf] = value
    except (TypeError, ValueError) as error:
      raise ConfigError(f"method {method.name!r} sets {key}={value!r}: {error}") from error
  return config


def method_configs(comparison: Comparison) -> dict[str, ml_collections.ConfigDict]:
  """{name: config} for every method in ``compare.methods``, all validated before any training."""
  config, compare = comparison.config, comparison.settings
  configs = {}
  for name in parse_method_names(compare.methods):
    method_config = apply_overrides(config, METHODS[name])
    try:
      validate_config(method_config)
    except ConfigError as error:
      raise ConfigError(f"method {name!r} ({_describe(METHODS[name])}): {error}") from error
    configs[name] = method_config
  if compare.seeds < 1:
    raise ConfigError(f"compare.seeds={compare.seeds} must be >= 1.")
  return configs


def _describe(method: Method) -> str:
  return " ".join(f"--config.{k}={v}" for k, v in method.overrides.items())

"""The benchmarks' cases: a config plus a named set of overrides, parsed from ``--cases``, applied and validated,
and the synthetic token batches they run on (no data directory needed). Shared by ``throughput.py``,
``loss_agreement.py`` and ``step_ops.py``.

``--cases``: cases separated by ";", each ``[name:]key=value[,key=value...]`` with keys relative to the
config (``model.moe.dispatcher=index,model.moe.capacity_factor=1.0``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.models import dispatch as dispatch_lib

DEFAULT_VOCAB_SIZE = 50_257  # GPT-2 BPE, the paper's vocabulary; used when model.vocab_size is 0
DENSE = "dense"
DENSE_OVERRIDES = {"model.moe.enabled": "False"}
REFERENCE = "reference"  # benchmarks/reference_gpt2.py: a plain JAX/Flax GPT-2 step of the dense backbone's shapes


@dataclasses.dataclass(frozen=True)
class Case:
  """A named set of config overrides: ``{"model.moe.capacity_factor": "1.0", ...}`` (values as typed)."""

  name: str
  overrides: dict[str, str]


def default_cases() -> list[Case]:
  """Index dispatch at capacity factor 2.0 and 1.0, and the grouped dispatcher where it exists."""
  dispatchers = ["index"] + (["grouped"] if "grouped" in dispatch_lib.DISPATCHERS else [])
  return [Case(f"{name}_cf{cf}", {"model.moe.dispatcher": name, "model.moe.capacity_factor": cf})
          for name in dispatchers for cf in ("2.0", "1.0")]


def parse_cases(text: str) -> list[Case]:
  """``"a:k=v,k=v; k=v"`` -> cases; an unnamed case is named by its overrides."""
  cases = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, _, body = part.partition(":") if ":" in part.split("=", 1)[0] else ("", "", part)
    overrides = {}
    for item in filter(None, (i.strip() for i in body.split(","))):
      key, sep, value = item.partition("=")
      if not sep or not key.strip():
        raise ValueError(f"bad case item {item!r} in {part!r}: write key=value, e.g. model.moe.capacity_factor=1.0")
      overrides[key.strip()] = value.strip()
    short = ",".join(f"{k.removeprefix('model.').removeprefix('moe.')}={v}" for k, v in overrides.items())
    cases.append(Case(name.strip() or short, overrides))
  names = [c.name for c in cases]
  if DENSE in names or len(set(names)) != len(names):
    raise ValueError(f"case names must be unique and not {DENSE!r} (the dense backbone is always measured): {names}")
  return cases


def _typed(old: Any, value: str, key: str) -> Any:
  if isinstance(old, bool):
    if value.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"{key}={value!r}: expected true or false")
    return value.lower() in ("true", "1")
  if isinstance(old, (int, float)):
    return type(old)(float(value)) if isinstance(old, float) else int(value)
  return value


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """A copy of ``config`` with ``overrides`` (dotted keys; string values converted to the key's type)."""
  config = ml_collections.ConfigDict(config.to_dict())
  for key, value in overrides.items():
    *path, leaf = key.split(".")
    section = config
    for part in path:
      section = section[part] if isinstance(section, ml_collections.ConfigDict) and part in section else None
    if not isinstance(section, ml_collections.ConfigDict) or leaf not in section:
      raise ConfigError(f"case override {key}={value}: the config has no key {key!r}.")
    section[leaf] = _typed(section[leaf], value, key) if isinstance(value, str) else value
  return config


def case_config(base: ml_collections.ConfigDict, overrides: dict[str, Any],
                vocab_size: int = DEFAULT_VOCAB_SIZE) -> ml_collections.ConfigDict:
  """``base`` with ``overrides``, ``model.vocab_size`` 0 filled with ``vocab_size``, validated."""
  config = apply_overrides(base, overrides)
  if not config.model.vocab_size:
    config.model.vocab_size = vocab_size
  validate_config(config)
  return config


def synthetic_batch(seed: int, batch_size: int, seq_len: int, vocab_size: int) -> dict[str, np.ndarray]:
  """Random tokens as a train batch: inputs / targets int32 [B, S] (targets = inputs shifted), weights ones."""
  tokens = np.random.default_rng(seed).integers(0, vocab_size, (batch_size, seq_len + 1), dtype=np.int32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": np.ones((batch_size, seq_len), np.float32)}

"""A run's config as frozen dataclasses: each section's fields typed, with their defaults and descriptions, once.

ml_collections stays the command-line format (presets in configs/, ``--config.x.y=`` overrides), and checkpoints and
summaries record that ConfigDict as before. :func:`typed` turns a config section (a ConfigDict, a dict such as a
recorded config, or already its dataclass) into its dataclass: the one place a missing key gets its value (the
field's ``absent`` metadata where set, for a config written before the key existed, else its default) and an unknown
key or a value of the wrong type is an error. A command types its config once, where it starts
(:func:`from_config`); the readers below it (the data layer, the models, the optimizer, the health guard, ...) take
the typed section they read.

``data`` is typed by the run's task (``LMDataSettings`` or ``TranslationDataSettings``).
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

import ml_collections

from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core.settings.compare import CompareSettings, GridSettings
from stablemoe_jax.core.settings.data import (FactsSettings, LMDataSettings, TranslationDataSettings,
                                              data_settings_class)
from stablemoe_jax.core.settings.model import MoESettings, ModelSettings
from stablemoe_jax.core.settings.routers import (BaseSettings, DeepSeekSettings, DistilledRouterSettings,
                                                 PAPER_AFFINITY, HashSettings, StableMoESettings, SwitchSettings,
                                                 section, setting)
from stablemoe_jax.core.settings.run import (AnalysisSettings, DecodeSettings, EvalSettings, HealthSettings,
                                             MeshSettings, TrainSettings)

__all__ = ["AnalysisSettings", "BaseSettings", "CompareSettings", "DecodeSettings", "DeepSeekSettings",
           "DistilledRouterSettings", "EvalSettings", "FactsSettings", "GridSettings", "HashSettings",
           "HealthSettings", "LMDataSettings", "MeshSettings", "MoESettings", "ModelSettings", "PAPER_AFFINITY",
           "RunSettings", "StableMoESettings", "SwitchSettings", "TrainSettings", "TranslationDataSettings",
           "absent_value", "added_settings", "config_dict", "from_config", "typed"]


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """A whole validated config, every section typed (``data`` by the task). The fields' order is the order of a
  preset's keys (:func:`config_dict`; ``config.json`` records them so)."""

  seed: int = setting(0, "the run's seed (parameters, dropout, routing shuffles, data order)")
  data: LMDataSettings | TranslationDataSettings = section(LMDataSettings,
                                                           "the corpus (its dataclass is the task's)")
  model: ModelSettings = section(ModelSettings, "the model")
  train: TrainSettings = section(TrainSettings, "training")
  mesh: MeshSettings = section(MeshSettings, "the device mesh (data, expert) over all devices of all processes")
  eval: EvalSettings = section(EvalSettings, "evaluation")
  health: HealthSettings = section(HealthSettings, "router health (docs/router_health.md): one verdict for every "
                                                   "router, on what each MoE layer does")
  analysis: AnalysisSettings = section(AnalysisSettings, "routing analysis (README \"Routing analysis\"): "
                                                         "records, fluctuation, cohesion")
  task: str = setting("lm", "lm | translation (configs written before the key existed are language models)",
                      carried=("translation",))
  decode: DecodeSettings = section(DecodeSettings, "translation decoding", carried=("translation",))
  compare: CompareSettings = section(CompareSettings, "a comparison's methods, seeds and grid", carried=())


_SECTION_PATHS = {RunSettings: "", ModelSettings: "model", MoESettings: "model.moe", TrainSettings: "train",
                  EvalSettings: "eval", DecodeSettings: "decode", MeshSettings: "mesh", HealthSettings: "health",
                  AnalysisSettings: "analysis", LMDataSettings: "data", FactsSettings: "data.facts",
                  TranslationDataSettings: "data",
                  CompareSettings: "compare", GridSettings: "compare.grid",
                  StableMoESettings: "model.moe.stablemoe",
                  SwitchSettings: "model.moe.switch", BaseSettings: "model.moe.base", HashSettings: "model.moe.hash",
                  DeepSeekSettings: "model.moe.deepseek", DistilledRouterSettings: "model.moe.distilled_router"}
_PRESETS = {TranslationDataSettings: "configs/mt_cpu.py", DecodeSettings: "configs/mt_cpu.py",
            FactsSettings: "configs/facts_cpu.py", CompareSettings: "configs/compare_cpu.py",
            GridSettings: "configs/compare_cpu.py"}
_SCALARS = {bool: "a bool", int: "an integer", float: "a number", str: "a string"}


@functools.cache
def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def absent_value(cls, name: str):
  """What a config lacking key ``name`` of section ``cls`` means: the field's ``absent`` metadata, else its default."""
  field = next(f for f in dataclasses.fields(cls) if f.name == name)
  if "absent" in field.metadata:
    return field.metadata["absent"]
  return field.default_factory() if field.default is dataclasses.MISSING else field.default


def added_settings(cls) -> dict[str, Any]:
  """The keys of section ``cls`` added after checkpoints were written (``added`` metadata), each at its absent value:
  a recorded config without one compares equal to a config holding that value (``train/checkpoint.py``)."""
  return {f.name: absent_value(cls, f.name) for f in dataclasses.fields(cls) if f.metadata.get("added")}


def _type_ok(kind, value) -> bool:
  if kind is bool:
    return isinstance(value, bool)
  if kind is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if kind is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  return isinstance(value, kind)


def _preset(cls) -> str:
  """The preset file whose section ``cls`` holds every key at its default."""
  return _PRESETS.get(cls, "configs/default.py")


def _section_class(cls, key: str, given: dict):
  """The dataclass of nested section ``key`` of ``cls`` (``data``'s is the task's), or None for a scalar field."""
  if cls is RunSettings and key == "data":
    return data_settings_class(given.get("task", absent_value(RunSettings, "task")))
  kind = _hints(cls)[key]
  return kind if dataclasses.is_dataclass(kind) else None


def _wrong_type(cls, prefix: str, key: str, value) -> str:
  field = next(f for f in dataclasses.fields(cls) if f.name == key)
  absent = absent_value(cls, key)
  meaning = "" if absent == field.default else f"; a config without the key means {absent!r}"
  return (f"{prefix}{key}={value!r} must be {_SCALARS[_hints(cls)[key]]} (the default {field.default!r}{meaning}); "
          f"set --config.{prefix}{key} to one.")


def typed(cls, section, path: str | None = None):
  """``section`` as dataclass ``cls`` (returned as is if it is one already; None: every key absent).

  Raises ConfigError naming the key for a key ``cls`` has no field for, or a value of the wrong type.
  """
  if isinstance(section, cls):
    return section
  path = _SECTION_PATHS.get(cls, cls.__name__) if path is None else path
  prefix = f"{path}." if path else ""
  hints, fields = _hints(cls), {f.name: f for f in dataclasses.fields(cls)}
  given = {} if section is None else {key: section[key] for key in section.keys()}
  values = {}
  for key, value in given.items():
    if key not in fields:
      keys = ", ".join(sorted(fields))
      raise ConfigError(f"{prefix}{key} is unknown; the {path or 'top-level'} keys are {keys} ({_preset(cls)}); "
                        f"drop it or correct its name.")
    kind, nested = hints[key], _section_class(cls, key, given)
    if nested is not None:
      values[key] = typed(nested, value, f"{prefix}{key}")
    elif kind in _SCALARS and not _type_ok(kind, value):
      raise ConfigError(_wrong_type(cls, prefix, key, value))
    else:
      values[key] = value
  for key in fields:
    if key in values:
      continue
    nested = _section_class(cls, key, given)
    values[key] = typed(nested, None, f"{prefix}{key}") if nested is not None else absent_value(cls, key)
  return cls(**values)


def from_config(config) -> RunSettings:
  """The whole config (a ConfigDict or a dict) as :class:`RunSettings`; see :func:`typed`."""
  return typed(RunSettings, config)


def config_dict(cls=RunSettings, task: str = "lm") -> ml_collections.ConfigDict:
  """The ConfigDict a preset starts from: the keys of section ``cls`` that ``task``'s presets carry, at their
  defaults, nested sections as ConfigDicts, in field order (``task`` itself where it is carried; ``data`` as the
  task's dataclass). A field's ``carried`` metadata names the tasks whose presets hold it (``()``: only a preset
  that states it, e.g. ``config.compare = settings.config_dict(settings.CompareSettings)``); every key is
  overridable from the command line (``--config.x.y=``), typed as its default."""
  config = ml_collections.ConfigDict()
  for field in dataclasses.fields(cls):
    if task not in field.metadata.get("carried", (task,)):
      continue
    if cls is RunSettings and field.name == "task":
      config.task = task
      continue
    nested = data_settings_class(task) if cls is RunSettings and field.name == "data" else _hints(cls)[field.name]
    if dataclasses.is_dataclass(nested):
      config[field.name] = config_dict(nested, task)
    else:
      config[field.name] = field.default
  return config

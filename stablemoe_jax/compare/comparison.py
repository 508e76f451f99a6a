"""A comparison as its command gave it: the base run config and its ``compare`` section, typed once.

``python -m stablemoe_jax.compare`` builds one :class:`Comparison` where it starts; the method table, the runner, the
sweep and the reports take it and read ``comparison.settings`` (``CompareSettings``) by attribute. The base config
stays a ConfigDict because it is a template: each method's runs are derived from it by overrides
(``compare/methods.py``), and the reports record it as given.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core.settings import typed
from stablemoe_jax.core.settings.compare import CompareSettings


@dataclasses.dataclass(frozen=True)
class Comparison:
  """``config``: the base run config every method's runs derive from; ``settings``: its ``compare`` section."""

  config: ml_collections.ConfigDict
  settings: CompareSettings

  @classmethod
  def of(cls, config: ml_collections.ConfigDict) -> Comparison:
    """The comparison ``config`` describes; a config without a ``compare`` section, or a bad one, is a ConfigError."""
    if "compare" not in config:
      raise ConfigError("the config has no compare section (compare.methods, compare.seeds); use --config "
                        "configs/compare_cpu.py or add one.")
    return cls(config, typed(CompareSettings, config.compare, "compare"))

  @property
  def method_names(self) -> list[str]:
    """``compare.methods`` as a list (unchecked: ``compare/methods.py``'s ``parse_method_names`` checks them)."""
    return [m.strip() for m in self.settings.methods.split(",") if m.strip()]

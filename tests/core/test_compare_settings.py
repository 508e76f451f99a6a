"""The typed ``compare`` section (stablemoe_jax/core/settings/compare.py) against the comparison presets: every key of
configs/compare_cpu.py's compare section is a field and every field a key, at the same default; every other preset's
keys are fields; a missing key reads as its ``absent`` value; an unknown key or a value of the wrong type is one
clear error naming it."""
from __future__ import annotations

import importlib

import ml_collections
import pytest

from configs import compare_cpu
from stablemoe_jax.compare import report, sweep
from stablemoe_jax.compare.comparison import Comparison
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core.settings import typed
from stablemoe_jax.core.settings.compare import CompareSettings, GridSettings
from tests.core.section_leaves import field_leaves as _fields, tree_leaves as _leaves

PRESETS = ("compare_cpu", "compare_mt_cpu", "tune_cpu", "tune_routers_cpu", "tune_mt_cpu", "lm_multi_cpu", "ablate_cpu",
           "xmoe_cpu")


def _compare(preset: str) -> ml_collections.ConfigDict:
  return importlib.import_module(f"configs.{preset}").get_config().compare


def test_compare_cpu_preset_is_the_dataclass_defaults_key_for_key():
  preset, fields = _leaves(compare_cpu.get_config().compare.to_dict()), _fields(CompareSettings)
  assert set(preset) == set(fields)
  assert preset == {key: field.default for key, field in fields.items()}
  assert typed(CompareSettings, compare_cpu.get_config().compare, "compare") == CompareSettings()
  for key, field in fields.items():
    assert field.metadata.get("help"), key  # every field says what it is


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_key_is_a_field_at_its_value(preset):
  section = _compare(preset)
  values = _leaves(section.to_dict())
  assert set(values) <= set(_fields(CompareSettings)), preset
  compare = typed(CompareSettings, section, "compare")
  assert {key: getattr(compare.grid if key.startswith("grid.") else compare, key.rpartition(".")[2])
          for key in values} == values


def test_a_missing_key_reads_as_its_absent_value():
  """A hand-built section (or configs/compare_mt_cpu.py's, which sets methods and seeds only) means what the
  readers took a missing key for: no methods, no grid, no results folder, every method paired with dense, training."""
  compare = typed(CompareSettings, ml_collections.ConfigDict({"seeds": 2}), "compare")
  assert (compare.methods, compare.seeds, compare.results_dir, compare.pairs, compare.report_only) == ("", 2, "", "",
                                                                                                       False)
  assert compare.grid == GridSettings() == typed(GridSettings, None, "compare.grid")
  assert typed(CompareSettings, compare, "compare") is compare
  config = importlib.import_module("configs.compare_mt_cpu").get_config()
  comparison = Comparison.of(config)
  assert "grid" not in config.compare and sweep.parse_grid(comparison) is None and report.pairs_of(comparison) is None
  assert report.contrasts_of(comparison) == []


@pytest.mark.parametrize("key, value, message", [
    ("method", "dense", "compare.method is unknown; the compare keys are contrasts, grid, methods, pairs, "
                        "report_only, results_dir, seeds "),
    ("grid.learning_rates", "1e-3", "compare.grid.learning_rates is unknown; the compare.grid keys are extra, "
                                    "learning_rate, per_method, steps, warmup_steps "),
    ("seeds", "3", "compare.seeds='3' must be an integer"),
    ("report_only", 1, "compare.report_only=1 must be a bool"),
    ("grid.learning_rate", 1e-3, "compare.grid.learning_rate=0.001 must be a string"),
])
def test_a_typo_key_or_a_wrong_type_is_one_clear_error(key, value, message):
  tree = compare_cpu.get_config().to_dict()
  *parents, leaf = key.split(".")
  section = tree["compare"]
  for parent in parents:
    section = section[parent]
  section[leaf] = value
  config = ml_collections.ConfigDict(tree)
  # The comparison command types its section once (Comparison.of), before any run or report reads it.
  for read in (lambda: typed(CompareSettings, config.compare, "compare"), lambda: Comparison.of(config)):
    with pytest.raises(ConfigError) as error:
      read()
    assert str(error.value).startswith(message), str(error.value)
    assert "\n" not in str(error.value)

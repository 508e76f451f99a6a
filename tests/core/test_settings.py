"""The typed settings (stablemoe_jax/core/settings/) and the presets built from them: configs/default.py is the
fields an LM carries at their defaults, configs/mt_cpu.py's keys the fields a translation carries; a missing key
reads as its ``absent`` value; an unknown key or a value of the wrong type is one clear error. A saved config of
every preset round-trips, and old checkpoints' configs load: tests/core/test_saved_configs.py."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import ml_collections
import pytest

from configs import default, mt_cpu
from stablemoe_jax.core import settings
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.experiment.config_validation import validate_config
from stablemoe_jax.models import routers
from tests.core.section_leaves import field_leaves, tree_leaves

UNTYPED = ("data", "compare")  # their own dataclasses, checked below and in test_compare_settings.py


def _fields(cls) -> dict[str, dataclasses.Field]:
  return field_leaves(cls, skip=UNTYPED if cls is settings.RunSettings else ())


def _leaves(tree: dict) -> dict[str, object]:
  return tree_leaves(tree, skip=UNTYPED)


def test_default_preset_is_built_from_the_dataclasses():
  """configs/default.py states no value of its own: it is the LM keys the dataclasses carry, at their defaults (the
  translation-only keys, a corpus's own keys and the comparison's section are the presets' that use them)."""
  preset, fields = _leaves(default.get_config().to_dict()), _fields(settings.RunSettings)
  carried_by_translation_only = {"task", "train.schedule", "train.label_smoothing", "eval.max_sentences"} | {
      key for key in fields if key.startswith("decode.")}
  assert set(preset) == set(fields) - carried_by_translation_only
  assert default.get_config() == settings.config_dict(settings.RunSettings, "lm")
  assert preset == {key: fields[key].default for key in preset}
  assert settings.from_config(default.get_config()) == dataclasses.replace(
      settings.RunSettings(), compare=settings.typed(settings.CompareSettings, None))  # no compare section
  for key, field in fields.items():
    assert field.metadata.get("help"), key  # every field says what it is


def test_translation_preset_carries_every_field_but_the_stated_ones():
  preset, fields = _leaves(mt_cpu.get_config().to_dict()), _fields(settings.RunSettings)
  assert set(preset) == set(fields)
  typed = settings.from_config(mt_cpu.get_config())
  assert (typed.task, typed.train.schedule, typed.train.label_smoothing) == ("translation", "inverse_sqrt", 0.1)
  assert typed.data == settings.TranslationDataSettings()  # the translation preset's data are the defaults
  assert typed.decode == settings.DecodeSettings()  # and so is its decoding
  stated = {f.name for f in dataclasses.fields(settings.TranslationDataSettings) if f.metadata.get("carried") == ()}
  assert stated == {"corpus", "train_files", "valid_files", "test_files", "tfds_data_dir"}
  assert set(mt_cpu.get_config().data) == {f.name for f in dataclasses.fields(settings.TranslationDataSettings)} - stated


@pytest.mark.parametrize("preset, cls", [(default, settings.LMDataSettings),
                                         (mt_cpu, settings.TranslationDataSettings)])
def test_each_task_s_data_section_is_its_dataclass_key_for_key(preset, cls):
  data = preset.get_config().data.to_dict()
  fields = {f.name: f for f in dataclasses.fields(cls)}
  assert set(data) <= set(fields)
  assert data == {key: fields[key].default for key in data}
  assert settings.from_config(preset.get_config()).data == cls(**data)
  assert all(f.metadata.get("help") for f in fields.values())


def test_the_task_chooses_the_data_dataclass_and_a_key_of_the_other_task_is_unknown():
  lm = ml_collections.ConfigDict({"data": {"corpus": "files", "train_files": "a/*.txt"}})
  assert settings.from_config(lm).data == settings.LMDataSettings(corpus="files", train_files="a/*.txt")
  translation = ml_collections.ConfigDict({"task": "translation", "data": {"pairs": "de-en"}})
  data = settings.from_config(translation).data
  assert (data.pairs, data.length_buckets, data.pack_pairs) == ("de-en", 1, False)  # absent buckets: one
  with pytest.raises(ConfigError, match=r"^data.pairs is unknown; the data keys are .*\(configs/default.py\)"):
    settings.from_config(ml_collections.ConfigDict({"data": {"pairs": "de-en"}}))
  with pytest.raises(ConfigError, match=r"^data.tokenizer is unknown; .*\(configs/mt_cpu.py\)"):
    settings.from_config(ml_collections.ConfigDict({"task": "translation", "data": {"tokenizer": "word"}}))


def test_registry_entries_own_the_router_sections():
  moe = settings.MoESettings()
  for name, entry in routers.ROUTERS.items():
    assert type(moe.router_settings(name)) is entry.settings, name
  assert {f.name for f in dataclasses.fields(settings.MoESettings)} >= set(routers.ROUTERS) | {"distilled_router"}


def test_a_missing_key_reads_as_its_absent_value():
  """A config written before a key existed (or a hand-built section) means the value that reproduces those runs,
  which for a few keys differs from the preset's default."""
  old = ml_collections.ConfigDict({"router": "stablemoe", "num_experts": 4, "stablemoe": {"balance_alpha": 0.2}})
  moe = settings.typed(settings.MoESettings, old)
  assert (moe.num_experts, moe.stablemoe.balance_alpha) == (4, 0.2)
  assert (moe.num_groups, moe.shuffle_tokens) == (1, False)  # the preset's 0 and True came later
  assert (moe.stablemoe.balance_scope, moe.stablemoe.affinity, moe.stablemoe.cosine_dim) == ("assigned", "dot", 0)
  assert moe.deepseek == settings.DeepSeekSettings() and moe.distilled_router == settings.DistilledRouterSettings()
  assert settings.typed(settings.HealthSettings, None) == settings.HealthSettings()
  assert settings.typed(settings.MoESettings, moe) is moe


@pytest.mark.parametrize("path, value, message", [
    ("model.moe.num_expert", 4, "model.moe.num_expert is unknown; the model.moe keys are base, block_size, "),
    ("model.moe.switch.topk", 2, "model.moe.switch.topk is unknown; the model.moe.switch keys are "),
    ("train.stpes", 10, "train.stpes is unknown; the train keys are "),
    ("model.moe.num_experts", "8", "model.moe.num_experts='8' must be an integer (the default 8); set "),
    ("model.moe.stablemoe.cosine_dim", "16", "model.moe.stablemoe.cosine_dim='16' must be an integer (the default 16; "
                                             "a config without the key means 0); set "),
    ("data.tokenizer", 3, "data.tokenizer=3 must be a string (the default 'word'); set --config.data.tokenizer"),
    ("data.tokeniser", "word", "data.tokeniser is unknown; the data keys are corpus, data_dir, eval_sets, "),
    ("model.moe.enabled", 1, "model.moe.enabled=1 must be a bool"),
    ("train.learning_rate", "1e-3", "train.learning_rate='1e-3' must be a number"),
    ("health.on_collapse", 2, "health.on_collapse=2 must be a string"),
])
def test_a_typo_key_or_a_wrong_type_is_one_clear_error(path, value, message):
  tree = default.get_config().to_dict()  # a preset file's value (a ConfigDict keeps a key's type once set)
  *parents, key = path.split(".")
  section = tree
  for parent in parents:
    section = section[parent]
  section[key] = value
  config = ml_collections.ConfigDict(tree)
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert str(error.value).startswith(message), str(error.value)
  assert "\n" not in str(error.value)


def test_a_typo_override_on_the_command_line_exits_2_with_one_line():
  result = subprocess.run(
      [sys.executable, "-m", "stablemoe_jax.main", "--config", "configs/default.py", "--workdir", "/nonexistent",
       "--mode=plan", "--config.model.moe.num_expert=4"], capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "num_expert" in result.stderr and "Traceback" not in result.stderr


# --- the type check at its edges (issue 75): the values of another type that Python's isinstance lets through --------

@pytest.mark.parametrize("cls, key, value, expected", [
    (settings.MoESettings, "num_experts", True, "an integer"),  # bool is an int subclass
    (settings.MoESettings, "num_experts", 8.0, "an integer"),  # a whole float is still not an integer
    (settings.TrainSettings, "learning_rate", True, "a number"),
    (settings.MoESettings, "enabled", 0, "a bool"),
    (settings.DecodeSettings, "sets", None, "a string"),
])
def test_a_value_of_a_neighbouring_type_is_refused_naming_the_key(cls, key, value, expected):
  with pytest.raises(ConfigError) as error:
    settings.typed(cls, {key: value})
  path = {settings.MoESettings: "model.moe", settings.TrainSettings: "train", settings.DecodeSettings: "decode"}[cls]
  assert str(error.value).startswith(f"{path}.{key}={value!r} must be {expected} (the default ")
  assert f"set --config.{path}.{key} to one." in str(error.value)


@pytest.mark.parametrize("cls, key, value", [
    (settings.TrainSettings, "learning_rate", 1),  # an integer is a number
    (settings.MoESettings, "num_experts", 1),
    (settings.MoESettings, "enabled", False),
    (settings.MoESettings, "enabled", True),
    (settings.DecodeSettings, "sets", ""),
])
def test_a_value_of_the_field_s_type_is_kept_as_given(cls, key, value):
  got = getattr(settings.typed(cls, {key: value}), key)
  assert got == value and type(got) is type(value)

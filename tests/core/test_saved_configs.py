"""A saved config loads back: every preset's config as ``config.json`` records it (``experiment/loop.py``) types to
the same settings and re-serialises to the same bytes, and the configs that older checkpoints recorded (the CPU
presets at earlier commits, tests/fixtures/old_configs/) still load, each missing key at its ``absent`` value."""
from __future__ import annotations

import importlib
import json
import pathlib

import ml_collections
import pytest

from stablemoe_jax.core import settings
from stablemoe_jax.train import checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRESETS = [(path.stem, None) for path in sorted((ROOT / "configs").glob("*.py")) if path.stem != "__init__"] + [
    ("lm_files", "lm_base"), ("mt_files", "mt_paper"), ("tune_facts_cpu", "name_first")]
OLD_CONFIGS = sorted((ROOT / "tests/fixtures/old_configs").glob("*.json"))


def _preset(name: str, arg: str | None) -> ml_collections.ConfigDict:
  module = importlib.import_module(f"configs.{name}")
  return module.get_config() if arg is None else module.get_config(arg)


@pytest.mark.parametrize("name, arg", PRESETS)
def test_a_saved_config_of_every_preset_round_trips(name, arg):
  config = _preset(name, arg)
  text = ml_collections.ConfigDict(config.to_dict()).to_json_best_effort(indent=2)  # as the loop writes config.json
  saved = json.loads(text)
  assert ml_collections.ConfigDict(saved).to_json_best_effort(indent=2) == text  # keys, order and types kept
  assert settings.from_config(saved) == settings.from_config(config)


@pytest.mark.parametrize("name, arg", PRESETS)
def test_every_preset_key_is_a_field_and_every_carried_field_a_key(name, arg):
  """A preset holds the keys its task carries (``settings.config_dict``) plus those it states (a corpus's own keys,
  a comparison's section); every one is a field, typed as its default (so ``--config.x.y=`` parses it alike)."""
  config = _preset(name, arg)
  task = config.get("task", "lm")
  base = settings.config_dict(settings.RunSettings, task)

  def check(section, built, path):
    for key in section:
      if isinstance(section[key], ml_collections.ConfigDict):
        check(section[key], built[key] if built is not None and key in built else None, f"{path}{key}.")
      elif built is not None and key in built:
        assert type(section[key]) is type(built[key]), f"{path}{key}"  # noqa: E721
    if built is not None and path not in ("data.", "compare."):  # presets of files / pairs rebuild their section
      assert set(built) <= set(section), (path, set(built) - set(section))

  check(config, base, "")
  settings.from_config(config)  # an unknown key or a value of the wrong type would raise


@pytest.mark.parametrize("path", OLD_CONFIGS, ids=lambda p: p.stem)
def test_old_checkpoints_configs_still_load(path):
  saved = json.loads(path.read_text())
  run = settings.from_config(saved)
  assert run.task == saved.get("task", "lm")
  assert run.model.moe.num_experts == saved["model"]["moe"]["num_experts"]
  checkpoint._comparable(saved, for_training=True)  # what a restore compares: no key it needs is missing


def test_the_oldest_config_reads_its_missing_keys_as_those_runs_had_them():
  """Written before the routing groups, the shuffle, the balance scope and X-MoE's routing existed (2026-11-26)."""
  saved = json.loads(next(p for p in OLD_CONFIGS if "c413b9f" in p.name).read_text())
  moe = settings.from_config(saved).model.moe
  assert (moe.num_groups, moe.shuffle_tokens, moe.shared_experts) == (1, False, 0)
  assert (moe.stablemoe.balance_scope, moe.stablemoe.affinity, moe.stablemoe.cosine_dim) == ("assigned", "dot", 0)
  assert moe.switch.top_k == 1 and moe.deepseek == settings.DeepSeekSettings()

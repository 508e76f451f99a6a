"""The config's bounds at their edges (issue 51): ``train`` and ``eval`` on both sides, and what a checkpoint's
config is compared on (a resumption, an evaluation, an old config). No training."""
from __future__ import annotations

import re

import pytest

from configs import default
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.experiment import config_validation
from stablemoe_jax.train import checkpoint as ckpt_lib


# --- the config's train and eval bounds, both sides ------------------------------------------------------------------

@pytest.mark.parametrize("key, value, ok", [
    ("train.stage1_steps", 850, True), ("train.stage1_steps", 851, False), ("train.stage1_steps", 0, True),
    ("train.stage1_steps", -1, False),
    ("train.warmup_steps", 849, True), ("train.warmup_steps", 850, False), ("train.warmup_steps", 0, True),
    ("train.steps", 1, True), ("train.steps", 0, False),
    ("train.microbatches", 4, True), ("train.microbatches", 3, False),  # batch_size 16 (default)
    ("train.router_lr_scale", 0.0, False), ("train.router_warmup_steps", -1, False),
    ("train.seq_len", 128, True), ("train.seq_len", 129, False), ("train.seq_len", 0, False),  # model.max_len 128
    ("eval.stride", 128, True), ("eval.stride", 129, False), ("eval.stride", 0, True),  # eval.seq_len 128
    ("eval.max_batches", 0, True), ("eval.max_batches", -1, False),
    ("train.log_every", 0, False), ("train.keep_checkpoints", 1, True),
])
def test_train_and_eval_bounds_on_both_sides(key, value, ok):
  config = default.get_config()
  section, name = key.split(".")
  assert (config.train.steps, config.train.batch_size, config.model.max_len, config.eval.seq_len) == (850, 16, 128, 128)
  config[section][name] = value
  if key == "train.steps":
    config.train.stage1_steps = config.train.warmup_steps = 0
  if ok:
    config_validation.validate_config(config)
  else:
    with pytest.raises(ConfigError, match=re.escape(f"{key}={value}")):
      config_validation.validate_config(config)


# --- what a checkpoint's config is compared on -----------------------------------------------------------------------

def _saved(**changes) -> dict:
  config = default.get_config()
  config.model.vocab_size = 10000
  saved = config.to_dict()
  for key, value in changes.items():
    section, name = key.split(".", 1)
    target = saved[section]
    *parents, leaf = name.split(".")
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return saved


def _differs(changes: dict, for_training: bool) -> list[str]:
  return ckpt_lib._differences(ckpt_lib._comparable(_saved(), for_training),  # pylint: disable=protected-access
                               ckpt_lib._comparable(_saved(**changes), for_training))  # pylint: disable=protected-access


@pytest.mark.parametrize("key, value", [
    ("train.log_every", 7), ("train.eval_every", 7), ("train.eval_batches", 7), ("train.checkpoint_every", 7),
    ("train.keep_checkpoints", 7),  # how a run is watched and saved, not what it computes
    ("model.moe.dispatcher", "grouped"), ("model.moe.eval_dispatcher", "grouped"), ("model.moe.block_size", 7),
    ("data.data_dir", "/elsewhere"), ("data.tfds_data_dir", "/elsewhere"),  # where the inputs lie
    ("mesh.expert", 4),  # the layout is never compared
])
def test_a_resumption_restores_across_settings_that_do_not_change_the_result(key, value):
  assert _differs({key: value}, for_training=True) == []


@pytest.mark.parametrize("key, value", [("train.learning_rate", 1e-3), ("train.steps", 900), ("seed", 5)])
def test_a_resumption_refuses_another_training_setting_an_evaluation_does_not(key, value):
  changes = {key: value} if key != "seed" else {}
  saved, current = _saved(), _saved(**changes)
  if key == "seed":
    current["seed"] = value
  compare = lambda training: ckpt_lib._differences(  # pylint: disable=protected-access
      ckpt_lib._comparable(saved, training), ckpt_lib._comparable(current, training))  # pylint: disable=protected-access
  assert len(compare(True)) == 1 and compare(True)[0].startswith(key)
  assert compare(False) == []


@pytest.mark.parametrize("key, value", [("model.d_model", 64), ("model.moe.num_experts", 4), ("data.tokenizer",
                                                                                                 "sentencepiece")])
def test_any_checkpoint_use_refuses_another_model_or_data_setting(key, value):
  assert [line.split(":")[0] for line in _differs({key: value}, for_training=False)] == [key]


def test_an_old_config_without_a_task_is_a_language_model_and_inverse_sqrt_drops_the_step_count():
  old, lm, translation = _saved(), _saved(), _saved()
  assert "task" not in old  # the default's config names no task
  lm["task"], translation["task"] = "lm", "translation"
  compare = lambda a, b: ckpt_lib._differences(ckpt_lib._comparable(a, False),  # pylint: disable=protected-access
                                               ckpt_lib._comparable(b, False))  # pylint: disable=protected-access
  assert compare(old, lm) == []
  assert compare(old, translation) == ["task: checkpoint 'lm', this config 'translation'"]
  longer = {"train.schedule": "inverse_sqrt", "train.steps": 2000}
  base = _saved(**{"train.schedule": "inverse_sqrt"})
  assert ckpt_lib._differences(ckpt_lib._comparable(base, True),  # pylint: disable=protected-access
                               ckpt_lib._comparable(_saved(**longer), True)) == []  # pylint: disable=protected-access
  assert _differs({"train.steps": 2000}, for_training=True) == ["train.steps: checkpoint 850, this config 2000"]

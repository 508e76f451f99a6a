"""The run's one-line checks at their edges (issue 51): a mode that reads a checkpoint, given a workdir without one,
stops before anything is built or written (the workdir left exactly as it was, or not created); the checkpoint files
a step counts from; a translation ``files`` corpus without its prepared shards refused before the workdir is
written; ``make_rows``' fit check on each side (source, target + eos) at exactly ``max_len``; and the config's
bounds (``train``, ``eval``) on both sides. No training: the command-line cases start the entry point (~3 s each)."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from tests.conftest import REPO

from configs import default, mt_cpu, mt_files
from stablemoe_jax.commands import analyze as analyze_command
from stablemoe_jax.commands import translate as translate_command
from stablemoe_jax.core.errors import ConfigError, DataError, DataNotFoundError
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.data.translation import pipeline as mt_pipeline
from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, EOS_ID
from stablemoe_jax.experiment import config_validation, loop
from stablemoe_jax.experiment import plan as plan_lib
from stablemoe_jax.train import checkpoint as ckpt_lib


def _tree(root: pathlib.Path) -> dict[str, bytes | None]:
  """Every path under ``root`` with its bytes (None: a folder), to compare a workdir before and after."""
  return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def _workdir(tmp_path: pathlib.Path, kind: str) -> pathlib.Path:
  """A workdir without a checkpoint: one that does not exist, or one holding a note and an empty checkpoints/."""
  workdir = tmp_path / "run"
  if kind == "existing":
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "notes.txt").write_text("mine\n")
  return workdir


def _save_checkpoint(directory: pathlib.Path, step: int) -> None:
  config = ml_collections.ConfigDict({"model": {"moe": {"num_groups": 1}}, "data": {}})
  checkpointer = ckpt_lib.Checkpointer(directory, config)
  checkpointer.save(step, {"w": jnp.ones(3)}, {"next_index": step})
  checkpointer.wait()
  checkpointer.close()


# --- a mode that reads a checkpoint, without one ---------------------------------------------------------------------

def _no_corpus_config():
  config = default.get_config()
  config.data.data_dir = "/nonexistent/ptb"  # the old order reached the corpus (and wrote the workdir) first
  return config


@pytest.mark.parametrize("kind", ["missing", "existing"])
@pytest.mark.parametrize("mode", ["eval", "analyze", "translate"])
def test_a_checkpoint_mode_without_a_checkpoint_stops_before_writing_anything(tmp_path, mode, kind):
  workdir = _workdir(tmp_path, kind)
  before = _tree(tmp_path)
  source = tmp_path / "in.txt"
  if mode == "translate":
    source.write_text("ein Satz\n")
    before = _tree(tmp_path)
    config = mt_cpu.get_config()
    config.data.data_dir = "/nonexistent/mt"
    call = lambda: translate_command.translate_file(config, workdir, None, "de", str(source), str(tmp_path / "o"))
  elif mode == "analyze":
    call = lambda: analyze_command.analyze_checkpoint(_no_corpus_config(), workdir)
  else:
    call = lambda: loop.evaluate_checkpoint(_no_corpus_config(), workdir)
  with pytest.raises(FileNotFoundError) as error:
    call()
  assert str(error.value) == (f"no checkpoint in {workdir / 'checkpoints'}; train first with --mode=train and this "
                              f"--workdir.")
  assert _tree(tmp_path) == before and workdir.exists() is (kind == "existing")


@pytest.mark.parametrize("mode, config, extra", [("eval", "configs/default.py", []),
                                                 ("analyze", "configs/default.py", []),
                                                 ("translate", "configs/mt_cpu.py", ["--src_lang=de"])])
def test_the_command_line_exits_2_with_one_line_and_creates_no_workdir(tmp_path, mode, config, extra):
  workdir = tmp_path / "mistyped" / "run"
  result = subprocess.run([sys.executable, "-m", "stablemoe_jax.main", "--config", config, "--workdir", str(workdir),
                           f"--mode={mode}", *extra], cwd=REPO, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL,
                          env={**os.environ, "STABLEMOE_DATA_DIR": str(tmp_path / "nowhere")})
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert errors == [f"error: no checkpoint in {workdir / 'checkpoints'}; train first with --mode=train and this "
                    f"--workdir."]
  assert list(tmp_path.iterdir()) == []  # neither the workdir nor its parent


def test_eval_at_a_step_that_was_not_saved_names_the_saved_ones_before_writing(tmp_path):
  workdir = tmp_path / "run"
  _save_checkpoint(workdir / "checkpoints", 2)
  (workdir / "checkpoints" / "9.orbax-checkpoint-tmp-1").mkdir()  # an unfinished save is no step
  before = _tree(tmp_path)
  with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 9 in .*; available steps: \[2\]"):
    loop.evaluate_checkpoint(_no_corpus_config(), workdir, step=9)
  assert _tree(tmp_path) == before
  loop.require_checkpoint(workdir)  # the latest, and step 2 itself, are there
  loop.require_checkpoint(workdir, 2)


def test_complete_steps_are_the_numbered_folders_with_a_saved_config(tmp_path):
  directory = tmp_path / "checkpoints"
  assert ckpt_lib.complete_steps(directory) == [] and not directory.exists()  # nothing created
  _save_checkpoint(directory, 4)
  _save_checkpoint(directory, 10)
  (directory / "12").mkdir()  # a numbered folder without its config: not a complete checkpoint
  assert ckpt_lib.complete_steps(directory) == [4, 10]
  assert ckpt_lib.saved_config(directory)["model"]["moe"]["num_groups"] == 1


# --- a translation `files` corpus without its prepared shards --------------------------------------------------------

def _mt_files_config():
  config = mt_files.get_config()
  config.data.pairs = "de-en,fr-en"
  for split in ("train", "valid", "test"):
    config.data[f"{split}_files"] = f"/nonexistent/{{pair}}/{split}.{{lang}}"
  return config


def test_mt_files_with_pairs_and_no_prepared_shards_stops_before_the_workdir_is_written(tmp_path):
  workdir = tmp_path / "run"
  with pytest.raises(DataNotFoundError) as error:
    loop.Experiment(_mt_files_config(), workdir)
  message = str(error.value)
  assert message.startswith(f"data.corpus='files' is read from shards that {workdir / 'data'} does not hold: "
                            f"prepare them first with `python -m stablemoe_jax.data.prepare --config CONFIG "
                            f"--workdir {workdir} --workers 8 --config.data.pairs='de-en,fr-en' "
                            f"--config.data.train_files='/nonexistent/{{pair}}/train.{{lang}}'")
  assert "\n" not in message and not workdir.exists()


def test_mt_files_with_its_prepared_manifest_is_not_refused(tmp_path):
  manifest = tmp_path / "run" / "data" / "translation" / mt_pipeline.MANIFEST
  config = _mt_files_config()
  with pytest.raises(DataNotFoundError, match="--config configs/mt_files.py "):
    config_validation.check_prepared(config, tmp_path / "run", "configs/mt_files.py")
  manifest.parent.mkdir(parents=True)
  manifest.write_text(json.dumps({}))
  config_validation.check_prepared(config, tmp_path / "run", "configs/mt_files.py")  # no error


# --- make_rows: a pair fits max_len or is one line ------------------------------------------------------------------

def _one_pair(source_len: int, target_len: int) -> batch_lib.EncodedSet:
  """A set of one pair: ``source_len`` source ids (tag and eos included), ``target_len`` bare target ids."""
  source = [[7] + list(range(10, 10 + source_len - 2)) + [EOS_ID]]
  target = [list(range(100, 100 + target_len))]
  return batch_lib.EncodedSet("de-en", "valid", *batch_lib._flatten(source), *batch_lib._flatten(target))


def test_a_target_of_max_len_minus_1_ids_fits_with_its_eos_in_the_last_position():
  batch = batch_lib.make_rows([(_one_pair(3, 7), 0)], rows=2, max_len=8)
  np.testing.assert_array_equal(batch["targets"][0], list(range(100, 107)) + [EOS_ID])
  np.testing.assert_array_equal(batch["decoder_inputs"][0], [BOS_ID] + list(range(100, 107)))
  np.testing.assert_array_equal(batch["weights"], [[1] * 8, [0] * 8])


def test_a_target_of_exactly_max_len_ids_is_the_one_line_error():
  """The source (3 positions) fits: only the target's branch of the check can refuse it."""
  with pytest.raises(ValueError) as error:
    batch_lib.make_rows([(_one_pair(3, 8), 0)], rows=1, max_len=8)
  assert str(error.value) == ("a pair of de-en valid does not fit 8 positions (source 3, target + eos 9); pass pairs "
                              "that fit.")


@pytest.mark.parametrize("source_len, fits", [(8, True), (9, False)])
def test_a_source_fits_up_to_exactly_max_len_positions(source_len, fits):
  rows = [(_one_pair(source_len, 2), 0)]
  if fits:
    assert batch_lib.make_rows(rows, rows=1, max_len=8)["source"][0, -1] == EOS_ID
  else:
    with pytest.raises(ValueError, match=r"does not fit 8 positions \(source 9, target \+ eos 3\)"):
      batch_lib.make_rows(rows, rows=1, max_len=8)


def _pairs(lengths: list[tuple[int, int]]) -> batch_lib.EncodedSet:
  """One set, a pair per (source positions, target ids)."""
  sources = [[7] + [11] * (s - 2) + [EOS_ID] for s, _ in lengths]
  targets = [[12] * t for _, t in lengths]
  return batch_lib.EncodedSet("de-en", "train", *batch_lib._flatten(sources), *batch_lib._flatten(targets))


def test_the_pairs_that_fit_are_those_make_rows_accepts():
  encoded = _pairs([(8, 7), (9, 7), (8, 8), (3, 0), (2, 1)])
  np.testing.assert_array_equal(encoded.fitting(8), [0, 3, 4])
  batch_lib.make_rows([(encoded, int(i)) for i in encoded.fitting(8)], rows=3, max_len=8)
  for refused in (1, 2):
    with pytest.raises(ValueError, match="does not fit 8 positions"):
      batch_lib.make_rows([(encoded, refused)], rows=1, max_len=8)


@pytest.mark.parametrize("lengths, fits", [([(8, 7)], True), ([(9, 7), (8, 8)], False)])
def test_training_needs_one_pair_of_each_language_pair_that_fits(lengths, fits):
  make = lambda: batch_lib.MixedPairIterator([_pairs(lengths)], batch_size=2, max_len=8, seed=0, temperature=1.0)
  if fits:
    assert next(make())["source"].shape == (2, 8)
  else:
    with pytest.raises(DataError, match=r"no training pair of de-en fits train.seq_len=8; raise it."):
      make()


@pytest.mark.parametrize("batch_size, processes, ok", [(4, 2, True), (4, 4, True), (6, 4, False)])
def test_the_batch_splits_evenly_over_the_processes(batch_size, processes, ok):
  make = lambda: batch_lib.MixedPairIterator([_pairs([(4, 3)])], batch_size, 8, seed=0, temperature=1.0,
                                             shard_count=processes)
  if ok:
    assert next(make())["source"].shape == (batch_size // processes, 8)
  else:
    with pytest.raises(ValueError, match=f"train.batch_size={batch_size} must be a multiple of the {processes}"):
      make()


@pytest.mark.parametrize("count, max_len, buckets", [(1, 64, (64,)), (3, 64, (16, 32, 64)), (7, 64, (1, 2, 4, 8,
                                                                                                     16, 32, 64))])
def test_length_buckets_halve_down_to_the_last_even_split(count, max_len, buckets):
  assert batch_lib.length_buckets(count, max_len) == buckets


@pytest.mark.parametrize("count, max_len", [(0, 64), (8, 64), (2, 63)])
def test_length_buckets_that_do_not_halve_evenly_are_refused(count, max_len):
  with pytest.raises(ValueError, match=f"data.length_buckets={count} needs train.seq_len={max_len} divisible"):
    batch_lib.length_buckets(count, max_len)


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


# --- the plan: its flags, and "fits" at exactly the memory -----------------------------------------------------------

@pytest.mark.parametrize("devices, memory, message", [(None, 80.0, "needs --plan_devices=N"),
                                                       (0, 80.0, "needs --plan_devices=N"),
                                                       (1, 0.0, "--plan_memory_gib=0.0 must be positive")])
def test_plan_flags_are_refused_at_their_bounds(devices, memory, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    plan_lib.check_plan_flags(devices, memory)


def test_plan_flags_accept_one_device_and_any_positive_memory():
  plan_lib.check_plan_flags(1, 1e-9)


def test_the_plan_fits_at_exactly_the_memory_and_not_one_byte_less():
  config = default.get_config()
  config.model.vocab_size = 10000
  first = plan_lib.plan(config, 1, 80.0, compile_step=False)
  total = sum(round(first[key] * plan_lib.GIB) for key in ("params_gib_per_device", "opt_state_gib_per_device",
                                                           "grads_gib_per_device", "activations_gib_per_device"))
  assert plan_lib.plan(config, 1, total / plan_lib.GIB, compile_step=False)["fits_with_config_microbatches"]
  less = plan_lib.plan(config, 1, (total - 1) / plan_lib.GIB, compile_step=False)
  assert not less["fits_with_config_microbatches"] and less["smallest_microbatches_that_fit"] == 2


# --- the analysis section: the routing sample and its launch ---------------------------------------------------------

@pytest.mark.parametrize("key, value, ok", [("analysis.record_every", 0, True), ("analysis.record_every", -1, False),
                                            ("analysis.sample_tokens", 128, True),  # one row of train.seq_len 128
                                            ("analysis.sample_tokens", 127, False),
                                            ("analysis.top_tokens", 1, True), ("analysis.top_tokens", 0, False)])
def test_analysis_bounds_on_both_sides(key, value, ok):
  config = default.get_config()
  section, name = key.split(".")
  config[section][name] = value
  if ok:
    config_validation.validate_config(config)
  else:
    with pytest.raises(ConfigError, match=re.escape(f"{key}={value}")):
      config_validation.validate_config(config)


@pytest.mark.parametrize("sample_tokens, devices, groups, record_every, message", [
    (1024, 8, 8, 25, None),  # 8 rows of 128 over 8 devices, 1024 tokens in 8 groups
    (1152, 8, 8, 25, "= 1152 // 128 = 9 rows of the routing sample) must be a multiple of the number of devices (8)"),
    (1152, 8, 8, 0, None),  # no routing records: no sample to split
    (1024, 8, 3, 25, "model.moe.num_groups=3 must divide the 1024 tokens of the routing sample"),
    (1024 + 127, 8, 8, 25, None),  # 1151 // 128 = 8 rows: whole rows only
])
def test_the_routing_sample_on_a_launch_of_n_devices(sample_tokens, devices, groups, record_every, message):
  from stablemoe_jax.analysis import recorder  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.analysis.sample_tokens, config.analysis.record_every = sample_tokens, record_every
  config.model.moe.num_groups = groups
  if message is None:
    recorder.check_devices(config, devices)
  else:
    with pytest.raises(ConfigError, match=re.escape(message)):
      recorder.check_devices(config, devices)


# --- locating the raw corpus: a layout counts only whole ---------------------------------------------------------------

def _ptb_layout(root: pathlib.Path, nested: bool, splits=("train", "valid", "test")) -> None:
  folder = root / "ptb" if nested else root
  folder.mkdir(parents=True, exist_ok=True)
  for split in splits:
    (folder / f"ptb.{split}.txt").write_text("a b\n")


def test_a_ptb_layout_missing_one_split_is_not_accepted_and_the_missing_file_is_named(tmp_path):
  from stablemoe_jax.data.common import locate  # pylint: disable=import-outside-toplevel
  _ptb_layout(tmp_path, nested=True, splits=("train", "valid"))
  with pytest.raises(DataNotFoundError, match=re.escape(f"(missing: {tmp_path / 'ptb' / 'ptb.test.txt'})")):
    locate.corpus_files(tmp_path, "ptb")
  _ptb_layout(tmp_path, nested=False)  # the flat layout is whole: it is taken
  assert locate.corpus_files(tmp_path, "ptb")["test"] == tmp_path / "ptb.test.txt"
  _ptb_layout(tmp_path, nested=True)  # both whole: the nested one, most specific, first
  assert locate.corpus_files(tmp_path, "ptb")["train"] == tmp_path / "ptb" / "ptb.train.txt"


def test_the_configured_data_dir_comes_before_the_environment(tmp_path, monkeypatch):
  from stablemoe_jax.data.common import locate  # pylint: disable=import-outside-toplevel
  _ptb_layout(tmp_path / "configured", nested=False)
  monkeypatch.setenv(locate.ENV_VAR, str(tmp_path / "nowhere"))
  assert locate.resolve_data_dir(str(tmp_path / "configured")) == tmp_path / "configured"
  with pytest.raises(DataNotFoundError, match=re.escape(f"{tmp_path / 'nowhere'} (from ${locate.ENV_VAR})")):
    locate.resolve_data_dir("")

"""The run's one-line checks at their edges (issue 51), a mode that reads a checkpoint: given a workdir without one,
it stops before anything is built or written (the workdir left exactly as it was, or not created); the checkpoint
files a step counts from. The command-line cases start the entry point (~3 s each)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
import pytest
from tests.conftest import REPO

from configs import default, mt_cpu
from stablemoe_jax.commands import analyze as analyze_command
from stablemoe_jax.commands import translate as translate_command
from stablemoe_jax.experiment import loop
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

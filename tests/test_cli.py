"""The command line as a user runs it: clear errors before compiling, and a real kill -9 mid-run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from conftest import MAIN, REPO, tiny_flags


def run_main(args, env=None):
  return subprocess.run([*MAIN, *args], cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True,
                        text=True, timeout=600)


def test_unknown_config_key_is_one_clear_error(tmp_path):
  result = run_main(["--workdir", str(tmp_path), "--config.train.stepz=3"])
  assert result.returncode == 2
  assert 'Did you mean "steps"' in result.stderr and "Traceback" not in result.stderr


def test_inconsistent_value_is_refused_before_anything_is_built(tmp_path):
  result = run_main(["--workdir", str(tmp_path), "--config.train.stage1_steps=5000"])
  assert result.returncode == 2
  assert "train.stage1_steps=5000 must lie in [0, train.steps=850]" in result.stderr
  assert not (tmp_path / "data").exists()


def test_missing_data_names_the_fix(tmp_path):
  result = run_main(["--workdir", str(tmp_path)], env={"STABLEMOE_DATA_DIR": str(tmp_path / "nowhere")})
  assert result.returncode == 2
  for fix in ("--config.data.data_dir", "STABLEMOE_DATA_DIR", "stablemoe_jax.data.download"):
    assert fix in result.stderr


TINY = tiny_flags(steps=40, stage1_steps=20, warmup_steps=4, log_every=5, checkpoint_every=5)


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_matches_uninterrupted_run(ptb_dir, tmp_path):
  env = {"STABLEMOE_DATA_DIR": str(ptb_dir)}
  full = run_main(["--workdir", str(tmp_path / "full"), *TINY], env=env)
  assert full.returncode == 0, full.stderr
  killed_dir = tmp_path / "killed"
  process = subprocess.Popen([*MAIN, "--workdir", str(killed_dir), *TINY], cwd=REPO, env={**os.environ, **env},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while not (killed_dir / "checkpoints" / "15").exists() and time.time() < deadline:
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  resumed = run_main(["--workdir", str(killed_dir), *TINY], env=env)
  assert resumed.returncode == 0, resumed.stderr
  assert "resumed from the checkpoint at step" in resumed.stdout
  summary = lambda d: json.loads((d / "summary.json").read_text())
  assert summary(killed_dir)["valid"] == summary(tmp_path / "full")["valid"]
  assert summary(killed_dir)["test"] == summary(tmp_path / "full")["test"]
  evaluated = run_main(["--workdir", str(killed_dir), "--mode=eval", "--split=test", *TINY], env=env)
  assert evaluated.returncode == 0, evaluated.stderr
  assert json.loads(evaluated.stdout[evaluated.stdout.index("{"):])["perplexity"] == summary(killed_dir)["test"]["perplexity"]

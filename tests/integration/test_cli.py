"""The command line as a user runs it: clear errors before compiling, and a real kill -9 mid-run."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from tests.conftest import MAIN, REPO, share_prepared_ptb, tiny_flags, xla_flags


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


@pytest.mark.slow
def test_bad_corpus_is_one_line_with_status_2_and_nothing_prepared(tmp_path):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for split in ("train", "valid", "test"):
    (corpus / f"{split}.txt").write_bytes(b"a b c\n")
  (corpus / "train.txt").write_bytes("na\xefve\n".encode("latin-1"))
  result = run_main(["--workdir", str(tmp_path / "run"), "--config.data.corpus=text",
                     f"--config.data.data_dir={corpus}"])
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines() == [
      f"error: {corpus / 'train.txt'}, line 1: byte 0xef at column 3 is not UTF-8; the corpus files must be UTF-8 "
      f"text. Convert the file, e.g. `iconv -f latin1 -t utf-8 {corpus / 'train.txt'} > {corpus / 'train.txt'}.utf8` "
      "(replace latin1 with its real encoding), and rename it."]
  assert not (tmp_path / "run" / "data").exists()
  (corpus / "train.txt").write_bytes(b"\n\n")
  result = run_main(["--workdir", str(tmp_path / "run"), "--config.data.corpus=text",
                     f"--config.data.data_dir={corpus}"])
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip() == f"error: {corpus / 'train.txt'}: the train split is empty (no line with text); " \
      "put one sentence or segment per line in it."


@pytest.fixture(scope="module")
def prepared_workdir(prepared_ptb, tmp_path_factory):
  """A workdir holding prepared data and no checkpoint: `--mode=eval` prints the devices, then stops (status 2)."""
  workdir = tmp_path_factory.mktemp("prepared")
  share_prepared_ptb(prepared_ptb, workdir)
  return workdir


@pytest.mark.parametrize("how", ["flag", "xla_flags"])
def test_cpu_device_count_from_flag_or_xla_flags(prepared_workdir, how):
  args = ["--workdir", str(prepared_workdir), "--mode=eval", "--config.model.moe.num_groups=4"]
  env = {"JAX_PLATFORMS": "cpu", "STABLEMOE_DATA_DIR": str(prepared_workdir / "nowhere")}
  if how == "flag":
    args.append("--cpu_devices=4")
  else:
    env["XLA_FLAGS"] = xla_flags(4)
  result = run_main(args, env=env)
  devices = ", ".join(f"CpuDevice(id={i})" for i in range(4))
  assert f"1 process(es), devices: [{devices}]" in result.stdout, result.stderr
  assert result.returncode == 2 and "no checkpoint in" in result.stderr  # data came from the workdir alone


TINY = tiny_flags(steps=40, stage1_steps=20, warmup_steps=4, log_every=5, checkpoint_every=5)


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_matches_uninterrupted_run(ptb_dir, prepared_ptb, tmp_path):
  """The resumed run and the evaluation get no corpus: they read the tokenizer and records in the workdir.

  The kill lands while the run is still going (checked right before it, and by what the run left: no summary, no
  step-40 checkpoint or log); the rerun must resume from the latest checkpoint on disk at that point and end with
  the uninterrupted run's logged losses and perplexities. Both runs' data folders are one tokenized corpus
  (``share_prepared_ptb``), which the resumed run and the evaluation, without the corpus, read from the workdir."""
  env = {"STABLEMOE_DATA_DIR": str(ptb_dir)}
  no_corpus = {"STABLEMOE_DATA_DIR": str(tmp_path / "nowhere")}
  share_prepared_ptb(prepared_ptb, tmp_path / "full", tmp_path / "killed")
  full = run_main(["--workdir", str(tmp_path / "full"), *TINY], env=env)
  assert full.returncode == 0, full.stderr
  killed_dir = tmp_path / "killed"
  process = subprocess.Popen([*MAIN, "--workdir", str(killed_dir), *TINY], cwd=REPO, env={**os.environ, **env},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 300
  # The first checkpoint (step 5 of 40): 35 steps and the final evaluation are still to come.
  while not (killed_dir / "checkpoints" / "5").exists() and time.monotonic() < deadline and process.poll() is None:
    time.sleep(0.05)
  assert process.poll() is None, "the run ended before it could be killed"
  process.send_signal(signal.SIGKILL)
  assert process.wait() == -signal.SIGKILL
  saved = sorted(int(p.name) for p in (killed_dir / "checkpoints").iterdir() if p.name.isdigit())
  assert saved and saved[-1] < 40, saved
  complete_lines = (killed_dir / "metrics.jsonl").read_text().split("\n")[:-1]  # a line cut by the kill is left out
  logged = [json.loads(line)["step"] for line in complete_lines]
  assert max(logged, default=0) < 40 and not (killed_dir / "summary.json").exists()
  resumed = run_main(["--workdir", str(killed_dir), *TINY], env=no_corpus)
  assert resumed.returncode == 0, resumed.stderr
  match = re.search(r"resumed from the checkpoint at step (\d+)", resumed.stdout)
  assert match and int(match.group(1)) == saved[-1], resumed.stdout
  summary = lambda d: json.loads((d / "summary.json").read_text())
  assert summary(killed_dir)["valid"] == summary(tmp_path / "full")["valid"]
  assert summary(killed_dir)["test"] == summary(tmp_path / "full")["test"]
  train_log = lambda d: [(r["step"], r["loss"]) for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
                         if "loss" in r]
  assert train_log(killed_dir) == train_log(tmp_path / "full") and len(train_log(killed_dir)) == 8
  unset = {k: v for k, v in os.environ.items() if k != "STABLEMOE_DATA_DIR"}
  evaluated = subprocess.run([*MAIN, "--workdir", str(killed_dir), "--mode=eval", "--split=test", *TINY], cwd=REPO,
                             env=unset, capture_output=True, text=True, timeout=600)
  assert evaluated.returncode == 0, evaluated.stderr
  assert json.loads(evaluated.stdout[evaluated.stdout.index("{"):])["perplexity"] == summary(killed_dir)["test"]["perplexity"]

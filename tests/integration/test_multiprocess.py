"""Several processes on this machine (jax.distributed, gloo): a dead peer stops the others in bounded time.

The runs read their tokenizer and records from the workdir (prepared once here), with STABLEMOE_DATA_DIR unset.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest
from tests.conftest import MAIN, REPO, tiny_flags

HEARTBEAT_S = 5
# 4 routing groups: a multiple of the device count of every layout used here (2 x 1 and 2 x 2).
WHOLE_SPLIT = ["--config.eval.max_batches=0"]  # the evaluations below: every valid token, the last batch padded
TINY = [*tiny_flags(steps=1000, stage1_steps=5, warmup_steps=2, log_every=3, checkpoint_every=3),
        "--config.model.moe.num_groups=4"]
ENV = {**{k: v for k, v in os.environ.items() if k != "STABLEMOE_DATA_DIR"}, "JAX_PLATFORMS": "cpu"}


def _workdir(prepared_ptb: pathlib.Path, path: pathlib.Path) -> pathlib.Path:
  """A workdir holding its own copy of conftest's prepared PTB."""
  shutil.copytree(prepared_ptb, path / "data")
  return path


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _children(pid: int) -> dict[int, str]:
  """{child pid: command line} of a running process, from /proc."""
  out = {}
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()
      if int(fields[1]) == pid:
        out[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, IndexError, ValueError):
      continue  # exited meanwhile
  return out


def _wait_for(predicate, timeout_s: float, what: str) -> None:
  deadline = time.time() + timeout_s
  while not predicate():
    if time.time() > deadline:
      pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
    time.sleep(0.1)


def _latest_checkpoint(workdir: pathlib.Path) -> int:
  return max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_killed_peer_stops_the_other_process_and_the_last_checkpoint_restores(prepared_ptb, tmp_path):
  workdir = _workdir(prepared_ptb, tmp_path / "run")
  port = _free_port()
  logs = [open(tmp_path / f"process{i}.log", "w+") for i in range(2)]
  distributed = [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                 f"--heartbeat_timeout_seconds={HEARTBEAT_S}"]
  processes = [subprocess.Popen([*MAIN, "--workdir", str(workdir), *TINY, *distributed, f"--process_id={i}"],
                                cwd=REPO, env=ENV, stdout=logs[i], stderr=subprocess.STDOUT) for i in range(2)]
  try:
    _wait_for(lambda: (workdir / "checkpoints" / "3").is_dir(), 900, "the checkpoint at step 3")
    processes[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    status = processes[0].wait(timeout=120)
    stopped_after = time.time() - killed_at
    print(f"process 0 stopped {stopped_after:.1f} s after process 1 was killed")
  finally:
    for p in processes:
      p.kill()
      p.wait()
  logs[0].seek(0)
  log = logs[0].read()
  assert status != 0
  assert stopped_after < HEARTBEAT_S + 25, stopped_after  # JAX's default heartbeat alone would take 100 s
  assert "stopped sending heartbeats" in log or "another task died" in log, log[-3000:]

  last = _latest_checkpoint(workdir)
  evaluated = subprocess.run(["bash", "launch/local_multiprocess.sh", "2", "--config", "configs/default.py",
                              "--workdir", str(workdir), "--mode=eval", *TINY, *WHOLE_SPLIT], cwd=REPO, env=ENV,
                             capture_output=True, text=True, timeout=600)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  result = json.loads(evaluated.stdout[evaluated.stdout.index("{"):])
  assert result["step"] == last and result["tokens"] == 73759
  # Reference: the same checkpoint evaluated by one process on one device.
  single = subprocess.run([*MAIN, "--workdir", str(workdir), "--mode=eval", *TINY, *WHOLE_SPLIT], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-3000:]
  reference = json.loads(single.stdout[single.stdout.index("{"):])
  assert reference["step"] == last and reference["tokens"] == result["tokens"]
  assert result["perplexity"] == pytest.approx(reference["perplexity"], rel=1e-5)


def test_launcher_stops_the_others_when_one_process_dies(prepared_ptb, tmp_path):
  workdir = _workdir(prepared_ptb, tmp_path / "run")
  launcher = subprocess.Popen(["bash", "launch/local_multiprocess.sh", "2", "--config", "configs/default.py",
                               "--workdir", str(workdir), *TINY], cwd=REPO,
                              env={**ENV, "GRACE_SECONDS": "3", "DEVICES_PER_PROCESS": "2"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    _wait_for(lambda: len(_children(launcher.pid)) == 2, 60, "two processes")
    time.sleep(2)  # let them start up
    children = _children(launcher.pid)
    victim = next(pid for pid, cmd in children.items() if "--process_id=1" in cmd)
    other = next(pid for pid in children if pid != victim)
    assert "--cpu_devices=2" in children[other]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    status = launcher.wait(timeout=60)
    stopped_after = time.time() - killed_at
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
      launcher.wait()
  stderr = launcher.stderr.read()
  assert status == 128 + signal.SIGKILL
  assert (f"launch: process 1 (pid {victim}) was killed by signal 9 (status 137); "
          "stopping the other 1 process(es).") in stderr
  assert stopped_after < 3 + 10, stopped_after
  assert not pathlib.Path(f"/proc/{other}").exists()  # stopped and reaped by the launcher


def test_launcher_exits_with_the_status_of_a_process_that_fails_and_names_it(tmp_path):
  """A config error ends each process with status 2 before anything is built: the launcher passes that status on
  and says which process ended how."""
  result = subprocess.run(["bash", "launch/local_multiprocess.sh", "2", "--config", "configs/default.py",
                           "--workdir", str(tmp_path / "run"), "--config.model.moe.router=nonesuch"], cwd=REPO,
                          env={**ENV, "GRACE_SECONDS": "3"}, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert re.search(r"launch: process [01] \(pid \d+\) exited with status 2; stopping the other [01] process\(es\)\.",
                   result.stderr), result.stderr[-3000:]
  assert "nonesuch" in result.stderr

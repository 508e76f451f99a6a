"""launch/sweep_workers.sh, its control flow alone: ``python`` on PATH is a stand-in for ``python -m
stablemoe_jax.compare`` that prints what a pass prints (the real comparison is tests/compare/test_sweep.py). The
script must repeat a pass that trained something, stop a worker on a config error, end as soon as its workers end
(not at the watchdog's deadline), and summarise each method's choices in the order the passes logged them."""
from __future__ import annotations

import os
import pathlib
import subprocess

from tests.conftest import REPO

# The stand-in: pass 1 trains a run; every later pass finds nothing left and logs the choices, one rejected.
PASSES = """#!/usr/bin/env bash
count="$FAKE_STATE/passes"; n=$(( $(cat "$count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$count"
if [[ -n "${FAKE_ERROR:-}" ]]; then echo "error: compare.methods='x': unknown method"; exit 1; fi
if (( n == 1 )); then echo "[1/2] switch lr0.002_warmup200 seed 1: trained in 5 s; valid ppl 9.9"; echo "training in"; fi
echo "switch: chose lr0.002_warmup200 (valid ppl 9.98)"
echo "switch: lr0.002_warmup200 rejected: the layer died in seed(s) [1]; choosing again."
echo "switch: chose lr0.001_warmup200 (valid ppl 11.99)"
echo "dense: chose lr0.002_warmup200 (valid ppl 10.14)"
"""


def _run(tmp_path: pathlib.Path, **env) -> subprocess.CompletedProcess:
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "python").write_text(PASSES)
  (bin_dir / "python").chmod(0o755)
  environment = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_STATE": str(tmp_path),
                 "WORKERS": "1", "DEADLINE_S": "600", **env}
  # A 60 s timeout: the deadline is 600 s, so a script that waited on its watchdog would fail here.
  return subprocess.run(["bash", "launch/sweep_workers.sh", "configs/tune_mt_cpu.py", str(tmp_path / "sweep")],
                        cwd=REPO, env=environment, capture_output=True, text=True, timeout=60)


def test_workers_repeat_a_pass_that_trained_and_the_summary_keeps_each_choice_in_order(tmp_path):
  result = _run(tmp_path)
  assert result.returncode == 0, result.stderr
  assert (tmp_path / "passes").read_text().strip() == "2"  # pass 1 trained, pass 2 found nothing left
  assert result.stdout.splitlines() == [
      "[1/2] switch lr0.002_warmup200 seed 1: trained in 5 s; valid ppl 9.9",
      "switch: chose lr0.002_warmup200 (valid ppl 9.98)",
      "switch: lr0.002_warmup200 rejected: the layer died in seed(s) [1]; choosing again.",
      "switch: chose lr0.001_warmup200 (valid ppl 11.99)",
      "dense: chose lr0.002_warmup200 (valid ppl 10.14)"]


def test_a_config_error_stops_the_worker_after_one_pass(tmp_path):
  result = _run(tmp_path, FAKE_ERROR="1")
  assert (tmp_path / "passes").read_text().strip() == "1"
  log = (tmp_path / "sweep" / "logs" / "worker0.log").read_text()
  assert "error: compare.methods='x'" in log and "worker 0: stopped by the error above (exit 1)" in log

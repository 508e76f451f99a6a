"""(slow) The documented commands on the CPU presets (``command_forms.RUN_CONFIGS``) run for real with the tiny
model's overrides appended, from a temporary folder: ``runs/...``, outputs and a copy of ``results/`` land there,
never in the repository. Trainings run first, so a command on a workdir finds it trained."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from tests.conftest import REPO, SHARED_DATA, share_prepared_ptb
from tests.integration.command_forms import GERMAN, _mode, _rewrite, _workdir, config_file, launches, tiny_runs


@dataclasses.dataclass(frozen=True)
class Workspace:
  """The folder the slow tier's commands run from (``root``) and the session's prepared PTB (``ptb``)."""
  root: pathlib.Path
  ptb: pathlib.Path

  def __truediv__(self, name) -> pathlib.Path:
    return self.root / name


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, prepared_ptb):
  """A folder the commands run from: configs/, launch/ and benchmarks/ linked to the repository's, a copy of
  results/ (a report writes there), the LM workdirs' data linked to the session's prepared PTB, a text corpus for
  docs/data.md's own-text command, German sentences to translate and small translation corpora."""
  from tests import mt_fixtures  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp("documented")
  for name in ("configs", "launch", "benchmarks"):
    (root / name).symlink_to(REPO / name, target_is_directory=True)
  shutil.copytree(REPO / "results", root / "results")
  (root / "text_corpus").mkdir()
  for split in ("train", "valid", "test"):
    lines = (SHARED_DATA / "ptb" / f"ptb.{split}.txt").read_text().splitlines()[:400]
    (root / "text_corpus" / f"{split}.txt").write_text("\n".join(lines) + "\n")
  (root / "sentences.de").write_text(GERMAN, encoding="utf-8")
  mt_fixtures.write_small_corpora(root / "mt_corpora")
  return Workspace(root, prepared_ptb)


def _run(workspace, command, program, args, env):
  """Runs one command from the workspace: (returncode, its whole output)."""
  if program == "sacrebleu":
    argv = [shutil.which("sacrebleu") or "sacrebleu", *args]
  else:
    argv = [sys.executable, *((program,) if program.endswith(".py") else ("-m", program)), *args]
  data_dir = str(workspace / "mt_corpora") if config_file(args) == "configs/mt_cpu.py" else str(SHARED_DATA)
  full_env = {**os.environ, **dict(command.env), **env, "STABLEMOE_DATA_DIR": data_dir, "JAX_PLATFORMS": "cpu",
              "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
  if env.get("XLA_FLAGS"):
    full_env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {env['XLA_FLAGS']}".strip()
  workdir = _workdir(args)
  if (workdir and config_file(args) == "configs/default.py" and not (workspace / workdir).exists()
      and not any(a.startswith("--config.data.") for a in args)):
    share_prepared_ptb(workspace.ptb, workspace / workdir)
  start = time.monotonic()
  result = subprocess.run(argv, cwd=workspace.root, env=full_env, capture_output=True, text=True, timeout=900)
  print(f"{time.monotonic() - start:6.1f} s  {command.source}: {program} {' '.join(args)[:120]}")
  return result.returncode, result.stdout + result.stderr


def _run_all(workspace, configs):
  failures = []
  selected = [(c, l) for c, l in launches() if config_file(l.args) in configs or
              (l.program == "sacrebleu" and None in configs)]
  runs, copies = tiny_runs(selected)
  copied = False
  for command, program, args, env in runs:
    if not copied and not (program == "stablemoe_jax.main" and _mode(args) == "train"):
      for source, destination in copies:  # the trainings ran
        if (workspace / source).exists() and not (workspace / destination).exists():
          shutil.copytree(workspace / source, workspace / destination, symlinks=True)
      copied = True
    args = _rewrite(args, workspace)
    code, tail = _run(workspace, command, program, args, env)
    if code != 0:
      failures.append(f"{command.source}: {command.text}\n  ran as: {program} {' '.join(args)}\n{tail[-3000:]}")
  return failures


@pytest.mark.slow
def test_lm_commands_run_on_the_tiny_model(workspace):
  """README's, docs' and the benchmarks' CPU language-model commands (configs/default.py), in file order: a run
  trains before the eval and analyze commands on its workdir."""
  failures = _run_all(workspace, ("configs/default.py",))
  assert not failures, "documented commands that fail:\n\n" + "\n\n".join(failures)


@pytest.mark.slow
def test_translation_commands_run_on_the_tiny_model(workspace):
  """The translation commands (configs/mt_cpu.py: train, eval, translate, sacreBLEU on the translations) on small
  slices of the corpora."""
  failures = _run_all(workspace, ("configs/mt_cpu.py", None))
  assert not failures, "documented commands that fail:\n\n" + "\n\n".join(failures)


@pytest.mark.slow
def test_report_commands_train_nothing(workspace):
  """The tuned comparison's report commands, on a copy of results/: they finish and train no run."""
  failures = []
  runs, _ = tiny_runs([(c, l) for c, l in launches() if config_file(l.args) == "configs/tune_cpu.py"])
  for command, program, args, env in runs:
    args = _rewrite(args, workspace)
    code, output = _run(workspace, command, program, args, env)
    if code != 0 or "training in" in output:
      failures.append(f"{command.source}: {command.text}\n  exit {code}\n{output[-3000:]}")
  assert not failures, "report commands that fail or train:\n\n" + "\n\n".join(failures)

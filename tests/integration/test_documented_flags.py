"""Every ``--flag`` of a documented command is one its program lists in ``--helpfull`` / ``--help``
(``command_forms.py`` parses the commands)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tests.conftest import REPO

from tests import doc_commands
from tests.integration.command_forms import skip_reason, unwrap


def _help_flags(program: str) -> set[str]:
  """The flags a program lists in its ``--helpfull`` (absl) or ``--help`` (argparse) output."""
  runner = [sys.executable, program] if program.endswith(".py") else [sys.executable, "-m", program]
  out = subprocess.run([*runner, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
  text = out.stdout + out.stderr
  if "--helpfull" in text:  # absl: --help lists the main module's flags, --helpfull all of them
    out = subprocess.run([*runner, "--helpfull"], cwd=REPO, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
  assert out.returncode in (0, 1) and "Traceback" not in text, f"{program} --help failed:\n{text[-2000:]}"
  return set(re.findall(r"--(?:\[no\])?([a-z][a-z0-9_]*)", text))


def _flag_checked():
  """(command, launch) of every command whose flags are checked: those that run here in some form, and the skipped
  ones of this project's own programs (benchmarks, entry points)."""
  found = [(c, unwrap(c)) for c in doc_commands.documented_commands(REPO)]
  return [(c, launch) for c, launch in found if launch is not None and launch.program != "sacrebleu" and
          (skip_reason(c) is None or launch.program.startswith(("stablemoe_jax.", "benchmarks")))]


@pytest.mark.parametrize("program", sorted({launch.program for _, launch in _flag_checked()}))
def test_documented_flags_exist(program):
  """Every ``--flag`` a documented command gives its program is a flag the program has."""
  known = _help_flags(program)
  wrong = []
  for command, launch in _flag_checked():
    if launch.program != program:
      continue
    for arg in launch.args:
      name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
      if name and not name.startswith("config.") and name.removeprefix("no") not in known and name not in known:
        wrong.append(f"{command.source}: --{name}")
  assert not wrong, f"flags {program} does not have:\n" + "\n".join(wrong)

"""Every documented launch on more than one device and every documented ``--mode=plan`` run as
``python -m stablemoe_jax.main ... --mode=plan --plan_devices=N`` (``command_forms.py`` parses the commands)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from tests.conftest import REPO, SHARED_DATA

from tests.doc_commands import Command
from tests.integration.command_forms import Launch, config_argv, launches


def plan_argv(launch: Launch, workdir: pathlib.Path) -> list[str] | None:
  """The ``--mode=plan`` form of a main-program launch on more than one device, or of a documented plan."""
  if launch.program != "stablemoe_jax.main":
    return None
  documented = "--mode=plan" in launch.args
  if not documented and launch.devices < 2:
    return None
  devices = next((a.split("=")[1] for a in launch.args if a.startswith("--plan_devices=")), launch.devices)
  memory = [a for a in launch.args if a.startswith("--plan_memory_gib=")]
  return ["-m", "stablemoe_jax.main", *config_argv(launch.args), "--workdir", str(workdir), "--mode=plan",
          f"--plan_devices={devices}", *memory]


def _plans() -> dict[tuple, list[Command]]:
  """{plan arguments (the workdir left out): the commands planned with them}: each distinct plan runs once."""
  plans = {}
  for command, launch in launches():
    argv = plan_argv(launch, pathlib.Path("WORKDIR"))
    if argv is not None:
      plans.setdefault(tuple(argv), []).append(command)
  return plans


@pytest.mark.parametrize("argv", list(_plans()), ids=lambda argv: ",".join(c.source for c in _plans()[argv]))
def test_launches_on_many_devices_pass_the_plan(argv, tmp_path):
  """A documented plan, or a launch on N devices planned for N devices (1 CPU device here: nothing compiles)."""
  commands = "\n".join(f"{c.source}: {c.text}" for c in _plans()[argv])
  argv = [str(tmp_path / "plan") if a == "WORKDIR" else a for a in argv]
  env = {**os.environ, "STABLEMOE_DATA_DIR": str(SHARED_DATA), "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, f"{commands}\nplanned as: {' '.join(argv)}\n{result.stderr[-3000:]}"
  assert "plan:" in result.stdout

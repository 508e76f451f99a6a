"""Every shell command the documentation gives runs here in a cheap form or is in SKIPS with its reason; every
documented config and override passes the program's checks; every preset the slow tier does not train is in NOT_RUN
with its reason. The tables and forms: ``command_forms.py``."""
from __future__ import annotations

from tests.conftest import REPO

from tests import doc_commands
from tests.integration.command_forms import (NOT_RUN, PROGRAMS_WITH_CONFIG, RUN_CONFIGS, SKIPS, check_config,
    config_file, launches, skip_reason, unwrap)


def test_every_documented_command_runs_here_or_is_skipped_with_its_reason():
  commands = doc_commands.documented_commands(REPO)
  assert len(commands) > 80, "the extraction lost commands"
  unknown = [c for c in commands if skip_reason(c) is None and unwrap(c) is None]
  assert not unknown, "commands this test cannot run; run them here or add them to SKIPS with a reason:\n" + \
      "\n".join(f"{c.source}: {c.text}" for c in unknown)
  used = {(c.source.split(":")[0], text) for c in commands for (f, text) in SKIPS
          if f == c.source.split(":")[0] and (c.text == text or c.text.startswith(text + " "))}
  stale = set(SKIPS) - used
  assert not stale, f"SKIPS entries that match no documented command any more: {sorted(stale)}"


def test_every_config_and_override_is_valid():
  """Each command's config with its overrides, as the program would check it before any work."""
  failures = []
  checked = 0
  for command, launch in launches():
    if launch.program in PROGRAMS_WITH_CONFIG and config_file(launch.args):
      try:
        check_config(launch.program, launch.args)
      except Exception as error:  # pylint: disable=broad-except
        failures.append(f"{command.source}: {command.text}\n  -> {type(error).__name__}: "
                        f"{str(error).strip()[:400]}")
      checked += 1
  assert checked > 50
  assert not failures, "documented commands whose config fails its checks:\n" + "\n".join(failures)


def test_every_preset_the_slow_tier_does_not_train_has_its_reason():
  """A documented training, eval or analysis on a config the tiny tier does not run names that config in NOT_RUN."""
  missing = sorted({f"{config_file(l.args)} ({c.source})" for c, l in launches()
                    if l.program in PROGRAMS_WITH_CONFIG and config_file(l.args)
                    and config_file(l.args) not in RUN_CONFIGS and config_file(l.args) not in NOT_RUN})
  assert not missing, f"add these configs to NOT_RUN with the reason they do not run here: {missing}"

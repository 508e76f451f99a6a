"""Top-k's config: bad ``top_k`` / ``shared_experts`` one config error (exit 2 and one line from the command line),
and a checkpoint config written before the new keys restoring at their old values."""
import pytest


# --- config errors ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"router": "switch", "switch.top_k": 0}, "model.moe.switch.top_k=0 must be an integer in [1, model.moe.num_experts=8]"),
    ({"router": "switch", "switch.top_k": 9}, "model.moe.switch.top_k=9 must be an integer in [1, "),
    ({"router": "switch", "switch.top_k": 2, "switch.fixed_routing": True}, "needs model.moe.switch.fixed_routing=False"),
    ({"shared_experts": -1}, "model.moe.shared_experts=-1 must be an integer >= 0"),
    ({"router": "stablemoe", "switch.top_k": 2}, "model.moe.switch.top_k=2 is a setting of router 'switch'"),
])
def test_bad_top_k_and_shared_experts_are_one_config_error(changes, message):
  from configs import default
  from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
  config = default.get_config()
  for key, value in changes.items():
    target = config.model.moe
    *sections, name = key.split(".")
    for section in sections:
      target = target[section]
    target[name] = value
  with pytest.raises(ConfigError) as error:
    validate_config(config)
  assert message in str(error.value) and "\n" not in str(error.value)


def _validated(changes):
  """configs/default.py with ``changes`` ({"key.under.model.moe": value}) set in its dict (a ConfigDict keeps a key's
  type once set, so a value of another type goes in as a dict's), validated."""
  import ml_collections
  from configs import default
  from stablemoe_jax.experiment.config_validation import validate_config
  tree = default.get_config().to_dict()
  for key, value in changes.items():
    target = tree["model"]["moe"]
    *sections, name = key.split(".")
    for section in sections:
      target = target[section]
    target[name] = value
  validate_config(ml_collections.ConfigDict(tree))


@pytest.mark.parametrize("changes", [
    {"shared_experts": 0}, {"shared_experts": 1},
    {"router": "switch", "switch.top_k": 1}, {"router": "switch", "switch.top_k": 8},
    {"router": "switch", "switch.top_k": 1, "switch.fixed_routing": True},  # one choice: the distilled router fits
    {"router": "switch", "switch.top_k": 2, "switch.fixed_routing": False},
])
def test_top_k_and_shared_experts_at_the_edges_pass(changes):
  _validated(changes)


@pytest.mark.parametrize("changes, message", [
    ({"shared_experts": True}, "model.moe.shared_experts=True must be an integer (the default 0)"),
    ({"shared_experts": 1.0}, "model.moe.shared_experts=1.0 must be an integer (the default 0)"),
    ({"router": "switch", "switch.top_k": True}, "model.moe.switch.top_k=True must be an integer (the default 1)"),
    ({"router": "switch", "switch.top_k": 2, "switch.fixed_routing": True},
     "model.moe.switch.top_k=2 needs model.moe.switch.fixed_routing=False: the distilled router routes each token to "
     "one expert; set --config.model.moe.switch.top_k=1 or drop fixed_routing."),
])
def test_a_top_k_or_shared_experts_of_another_type_is_one_error_naming_the_key(changes, message):
  from stablemoe_jax.experiment.config_validation import ConfigError
  with pytest.raises(ConfigError) as error:
    _validated(changes)
  assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)


def test_bad_top_k_exits_2_with_one_line_from_the_command_line(tmp_path):
  import os
  import subprocess
  from tests.conftest import MAIN, REPO
  result = subprocess.run([*MAIN, "--workdir", str(tmp_path), "--config.model.moe.router=switch",
                           "--config.model.moe.switch.top_k=0"], cwd=REPO, env=dict(os.environ), capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  errors = [line for line in result.stderr.splitlines() if "top_k" in line]
  assert len(errors) == 1 and "model.moe.switch.top_k=0 must be an integer in [1, " in errors[0]


def test_a_checkpoint_config_written_before_the_new_keys_restores_at_their_old_values():
  # model.moe.shared_experts and switch.top_k did not exist before issue 52: a checkpoint's config without them
  # compares equal to one at 0 and 1 (the runs it reproduces), and differs from any other value.
  from configs import default
  from stablemoe_jax.train import checkpoint
  current = default.get_config().to_dict()
  old = default.get_config().to_dict()
  del old["model"]["moe"]["shared_experts"], old["model"]["moe"]["switch"]["top_k"], old["model"]["moe"]["deepseek"]
  compare = lambda a, b: checkpoint._differences(checkpoint._comparable(a, True), checkpoint._comparable(b, True))
  assert compare(old, current) == []
  current["model"]["moe"]["shared_experts"] = 1
  current["model"]["moe"]["switch"]["top_k"] = 2
  assert compare(old, current) == ["model.moe.shared_experts: checkpoint '<absent>', this config 1",
                                   "model.moe.switch.top_k: checkpoint '<absent>', this config 2"]
  assert "top_k" in default.get_config().model.moe.switch  # the config itself is unchanged by the comparison

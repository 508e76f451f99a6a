"""The plan's and the analysis section's bounds at their edges (issue 51): the plan's flags, "fits" at exactly the
memory, the analysis bounds and the routing sample on a launch of N devices. No training."""
from __future__ import annotations

import re

import pytest

from configs import default
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.experiment import config_validation
from stablemoe_jax.experiment import plan as plan_lib


# --- the plan: its flags, and "fits" at exactly the memory -----------------------------------------------------------

@pytest.mark.parametrize("devices, memory, message", [(None, 80.0, "needs --plan_devices=N"),
                                                       (0, 80.0, "needs --plan_devices=N"),
                                                       (1, 0.0, "--plan_memory_gib=0.0 must be positive")])
def test_plan_flags_are_refused_at_their_bounds(devices, memory, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    plan_lib.check_plan_flags(devices, memory)


def test_plan_flags_accept_one_device_and_any_positive_memory():
  plan_lib.check_plan_flags(1, 1e-9)


def test_the_plan_fits_at_exactly_the_memory_and_not_one_byte_less():
  config = default.get_config()
  config.model.vocab_size = 10000
  first = plan_lib.plan(config, 1, 80.0, compile_step=False)
  total = sum(round(first[key] * plan_lib.GIB) for key in ("params_gib_per_device", "opt_state_gib_per_device",
                                                           "grads_gib_per_device", "activations_gib_per_device"))
  assert plan_lib.plan(config, 1, total / plan_lib.GIB, compile_step=False)["fits_with_config_microbatches"]
  less = plan_lib.plan(config, 1, (total - 1) / plan_lib.GIB, compile_step=False)
  assert not less["fits_with_config_microbatches"] and less["smallest_microbatches_that_fit"] == 2


# --- the analysis section: the routing sample and its launch ---------------------------------------------------------

@pytest.mark.parametrize("key, value, ok", [("analysis.record_every", 0, True), ("analysis.record_every", -1, False),
                                            ("analysis.sample_tokens", 128, True),  # one row of train.seq_len 128
                                            ("analysis.sample_tokens", 127, False),
                                            ("analysis.top_tokens", 1, True), ("analysis.top_tokens", 0, False)])
def test_analysis_bounds_on_both_sides(key, value, ok):
  config = default.get_config()
  section, name = key.split(".")
  config[section][name] = value
  if ok:
    config_validation.validate_config(config)
  else:
    with pytest.raises(ConfigError, match=re.escape(f"{key}={value}")):
      config_validation.validate_config(config)


@pytest.mark.parametrize("sample_tokens, devices, groups, record_every, message", [
    (1024, 8, 8, 25, None),  # 8 rows of 128 over 8 devices, 1024 tokens in 8 groups
    (1152, 8, 8, 25, "= 1152 // 128 = 9 rows of the routing sample) must be a multiple of the number of devices (8)"),
    (1152, 8, 8, 0, None),  # no routing records: no sample to split
    (1024, 8, 3, 25, "model.moe.num_groups=3 must divide the 1024 tokens of the routing sample"),
    (1024 + 127, 8, 8, 25, None),  # 1151 // 128 = 8 rows: whole rows only
])
def test_the_routing_sample_on_a_launch_of_n_devices(sample_tokens, devices, groups, record_every, message):
  from stablemoe_jax.analysis import recorder  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.analysis.sample_tokens, config.analysis.record_every = sample_tokens, record_every
  config.model.moe.num_groups = groups
  if message is None:
    recorder.check_devices(from_config(config), devices)
  else:
    with pytest.raises(ConfigError, match=re.escape(message)):
      recorder.check_devices(from_config(config), devices)

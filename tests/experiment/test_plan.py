"""--mode=plan: exact per-device state bytes, the activation estimate against XLA's, all-to-all bytes, errors."""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from tests.conftest import MAIN, REPO, make_tiny_config

from stablemoe_jax.experiment import plan
from stablemoe_jax.models import flops
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.core.settings import ModelSettings, from_config, typed


def _config(ptb_dir, expert=1):
  config = make_tiny_config(ptb_dir)
  config.model.vocab_size = 500
  config.model.moe.num_groups = 4
  config.mesh.expert = expert
  config.train.batch_size = 8
  return config


def test_state_bytes_are_exact_from_the_shardings(ptb_dir):
  config = _config(ptb_dir, expert=4)
  params = nn.unbox(TransformerLM(typed(ModelSettings, config.model)).init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32),
                                                     jnp.array(True))["params"])
  counts = flops.param_counts(params)
  got = plan.state_bytes_per_device(from_config(config), num_devices=4)
  # Expert parameters split 4 ways over `expert`, everything else replicated; float32.
  assert got["params"] == 4 * (counts["shared"] + counts["expert"] // 4)
  assert got["params_total"] == 4 * counts["total"]
  # Adam keeps two moments per parameter (the frozen group's masked Adam too), plus a few int32 step counts.
  assert 0 <= got["opt_state"] - 2 * got["params"] <= 64


def test_activation_estimate_is_close_to_xla_compiled_temp(ptb_dir):
  config = _config(ptb_dir)
  config.model.d_model, config.model.d_ff, config.train.seq_len, config.model.max_len = 64, 256, 32, 32
  config.eval.seq_len = 32
  run = from_config(config)
  estimate = plan.activation_bytes_per_device(run, 1, 1) + plan.state_bytes_per_device(run, 1)["params"]
  compiled = plan.compiled_temp_bytes(run, 1)
  assert 0.5 <= estimate / compiled <= 2.0, (estimate, compiled)


def test_all_to_all_bytes_hand_count(ptb_dir):
  config = _config(ptb_dir, expert=2)
  # 8 x 16 tokens in 4 groups of 32; C = ceil(2.0 * 32 / 4) = 16 per (group, expert): 4 x 4 x 16 slots of d=32
  # float32, a quarter of them on each of 4 devices; half leave the device; 4 transfers (2 forward, 2 backward).
  buffer = 4 * 4 * 16 * 32 * 4 / 4
  assert plan.all_to_all_bytes_per_device(from_config(config), 4) == 4 * buffer / 2
  config.mesh.expert = 1
  assert plan.all_to_all_bytes_per_device(from_config(config), 4) == 0



def test_topk_and_shared_experts_in_the_activation_and_all_to_all_estimates(ptb_dir):
  config = _config(ptb_dir, expert=2)
  config.model.moe.router = "switch"
  base = plan.activation_bytes_per_device(from_config(config), 4, 1)
  sends = plan.all_to_all_bytes_per_device(from_config(config), 4)
  model = config.model
  d, f, sublayers = model.d_model, model.moe.d_ff or model.d_ff, model.moe.sublayers_per_expert  # one MoE layer
  tokens = 8 * 16 / 4  # a device's tokens of the 8 x 16 batch
  moe = config.model.moe
  slots = max(moe.capacity_factor, 1.0)  # capacity slots a token at top-1
  config.model.moe.switch.top_k = 2  # twice the capacity slots (capacity counts choices), one more row each way
  assert plan.activation_bytes_per_device(from_config(config), 4, 1) - base == tokens * (
      slots * (sublayers * (4 * d + 2 * f) + 2 * d) + 2 * d) * 4
  step_tokens, groups, n = 8 * 16, moe.num_groups, moe.num_experts
  assert sends == 4 * n * math.ceil(moe.capacity_factor * step_tokens / groups / n) * groups / 4 * d * 4 / 2
  assert plan.all_to_all_bytes_per_device(from_config(config), 4) == (
      4 * n * math.ceil(moe.capacity_factor * 2 * step_tokens / groups / n) * groups / 4 * d * 4 / 2)
  config.model.moe.switch.top_k, config.model.moe.shared_experts = 1, 1  # every token through one more expert
  assert plan.activation_bytes_per_device(from_config(config), 4, 1) - base == tokens * sublayers * (4 * d + 2 * f) * 4
  assert plan.all_to_all_bytes_per_device(from_config(config), 4) == sends  # replicated: nothing travels

def test_plan_fits_and_picks_microbatches(ptb_dir):
  config = _config(ptb_dir)
  result = plan.plan(config, 2, memory_gib=80.0, compile_step=False)
  assert result["fits_with_config_microbatches"] and result["smallest_microbatches_that_fit"] == 1
  tiny_memory = (result["params_gib_per_device"] * 4 + result["activations_gib_per_device"] * 0.6)
  squeezed = plan.plan(config, 2, memory_gib=tiny_memory, compile_step=False)
  assert not squeezed["fits_with_config_microbatches"] and squeezed["smallest_microbatches_that_fit"] == 2


@pytest.mark.slow
def test_plan_cli_needs_devices_and_checks_the_layout(tmp_path):
  import subprocess
  base = [*MAIN, "--workdir", str(tmp_path), "--mode=plan"]
  missing = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert missing.returncode == 2 and "--plan_devices=N" in missing.stderr and "Traceback" not in missing.stderr
  bad = subprocess.run([*base, "--plan_devices=6", "--config.mesh.expert=4"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
  assert bad.returncode == 2 and "mesh.expert=4 must divide the number of devices (6)" in bad.stderr
  good = subprocess.run([*base, "--plan_devices=8", "--config.mesh.expert=4", "--config.model.moe.num_groups=8",
                         "--config.model.vocab_size=10000"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert good.returncode == 0, good.stderr[-2000:]
  assert "mesh data=2 x expert=4" in good.stdout and "smallest train.microbatches that fits: 1" in good.stdout

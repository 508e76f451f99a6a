"""--mode=plan for translation: the encoder-decoder's exact state bytes against its real init, the paper's preset."""
from __future__ import annotations

import subprocess
import sys

import jax
import numpy as np
import pytest
from tests.conftest import REPO
from tests.mt_fixtures import tiny_model_config

from stablemoe_jax.core.settings import from_config
from stablemoe_jax.experiment import plan
from stablemoe_jax.models import flops
from stablemoe_jax.tasks import make_task
from stablemoe_jax.train import state as state_lib
from stablemoe_jax.train.optimizer import make_optimizer


def test_translation_plan_counts_the_real_parameters():
  config = tiny_model_config(vocab_size=40)
  config.mesh.expert, config.model.moe.num_groups, config.train.batch_size = 2, 2, 8
  task = make_task(from_config(config))
  model = task.build_model(from_config(config).model)
  real = state_lib.create_train_state(model, make_optimizer(from_config(config).train), 0, config.train.seq_len,
                                      sample_inputs=task.sample_inputs(from_config(config)))
  counts = flops.param_counts(jax.device_get(real.params))
  assert sum(x.size for x in jax.tree.leaves(real.params)) == counts["total"]
  assert counts["expert"] > 0  # both MoE layers' experts
  got = plan.state_bytes_per_device(from_config(config), num_devices=2)
  assert got["params_total"] == 4 * counts["total"]
  assert got["params"] == 4 * (counts["shared"] + counts["expert"] // 2)  # experts split over mesh.expert=2
  assert 0 <= got["opt_state"] - 2 * got["params"] <= 64
  result = plan.plan(config, num_devices=2, memory_gib=1.0, compile_step=False)
  assert result["vocab_size"] == 40 and result["fits_with_config_microbatches"]
  assert plan.num_moe_layers(from_config(config)) == 2 and result["all_to_all_gib_per_step_per_device"] > 0


@pytest.mark.slow
def test_translation_plan_compiles_the_train_step():
  config = tiny_model_config(vocab_size=40)
  temp = plan.compiled_temp_bytes(from_config(config), num_devices=1)
  estimate = plan.activation_bytes_per_device(from_config(config), 1, 1)
  assert temp is not None and temp > 0 and estimate > 0
  assert np.isfinite(temp / estimate)


def test_plan_mode_of_the_paper_preset_needs_no_data(tmp_path):
  run = subprocess.run([sys.executable, "-m", "stablemoe_jax.main", "--config", "configs/mt_paper.py", "--workdir", str(tmp_path),
                        "--mode=plan", "--plan_devices=8",
                        "--config.model.moe.num_groups=8"], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={"STABLEMOE_DATA_DIR": str(tmp_path / "no_data"), "PATH": "/usr/bin:/bin"})
  assert run.returncode == 0, run.stderr[-2000:]
  assert "plan: 8 devices" in run.stdout and "vocab 64000" in run.stdout
  assert not (tmp_path / "data").exists()

"""Every preset in configs/ on 1, 8 and 64 devices; the automatic routing groups recorded and honoured; the paper
presets stop with one line naming the preparation command before anything is prepared or compiled."""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
from tests.conftest import REPO, make_tiny_config, share_prepared_ptb, xla_flags

from stablemoe_jax.core.errors import CheckpointMismatchError, ConfigError, DataNotFoundError
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment import plan as plan_lib

# Every config file (its ``:arg`` variants too) and how the plan (no compile) ends on 1, 8 and 64 devices: the number
# of routing groups it resolves, or the start of the one line that says why it cannot run there.
BATCH_16 = "train.batch_size / train.microbatches=16 must be a multiple of the number of devices (64)"
NO_PAIRS = "data.pairs='': no pair given"
BATCH_32 = "train.batch_size / train.microbatches=32 must be a multiple of the number of devices (64)"
EXPECTED = {
    "default": (1, 8, BATCH_16),
    "tune_cpu": (1, 8, BATCH_16),
    "tune_routers_cpu": (1, 8, BATCH_16),
    "compare_cpu": (1, 8, BATCH_16),
    "ablate_cpu": (1, 8, BATCH_16),
    "xmoe_cpu": (1, 8, BATCH_16),
    "lm_files": (1, 8, BATCH_16),
    "lm_multi_cpu": (1, 8, BATCH_16),
    "facts_cpu": (1, 8, BATCH_32),
    "tune_facts_cpu": (1, 8, BATCH_32),
    "tune_facts_cpu:name_first": (1, 8, BATCH_32),
    "lm_base": (64, 64, 64),
    "lm_files:lm_base": (64, 64, 64),
    "lm_large": ("mesh.expert=8 must divide the number of devices (1)", 64, 64),
    "mt_cpu": (1, 8, 64),
    "compare_mt_cpu": (1, 8, 64),
    "tune_mt_cpu": (1, 8, 64),
    "mt_paper": (1, 8, 64),
    "mt_wmt": (1, 8, 64),
    "mt_files": (NO_PAIRS,) * 3,
    "mt_files:mt_paper": (NO_PAIRS,) * 3,
}
DEVICES = (1, 8, 64)


def preset(name: str):
  module, _, arg = name.partition(":")
  get_config = importlib.import_module(f"configs.{module}").get_config
  return get_config(arg) if arg else get_config()


def test_the_table_names_every_config_file():
  files = {p.stem for p in (REPO / "configs").glob("*.py") if p.stem != "__init__"}
  assert files == {name.partition(":")[0] for name in EXPECTED}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_preset_plans_on_1_8_and_64_devices_or_says_why(name):
  for devices, expected in zip(DEVICES, EXPECTED[name]):
    config = preset(name)
    if isinstance(expected, str):
      with pytest.raises(ConfigError) as error:
        plan_lib.plan(config, devices, 80.0, compile_step=False)
      assert str(error.value).startswith(expected) and "\n" not in str(error.value)
      continue
    result = plan_lib.plan(config, devices, 80.0, compile_step=False)
    assert result["num_groups"] == expected and result["devices"] == devices
    # What a launch on that many devices needs, from the config itself: whole rows and whole routing groups on every
    # device, and the routing sample's rows split over the devices.
    train, moe = config.train, config.model.moe
    rows = train.batch_size // train.microbatches
    assert rows % devices == 0 and config.eval.batch_size % devices == 0
    assert expected % devices == 0 and rows * train.seq_len % expected == 0
    assert (config.analysis.sample_tokens // train.seq_len) % devices == 0
    assert moe.num_groups in (0, expected)  # 0: one group per device


def test_the_plan_makes_the_launchs_routing_sample_check():
  """lm_base's former 4 sample rows passed the plan on 8 devices and stopped the launch after data and init."""
  config = preset("lm_base")
  config.analysis.sample_tokens = 4 * 1024
  plan_lib.plan(config, 4, 80.0, compile_step=False)  # 4 rows over 4 devices: fine
  with pytest.raises(ConfigError, match=r"= 4 rows of the routing sample\) must be a multiple of the number of "
                                        r"devices \(8\); set --config.analysis.sample_tokens to a multiple of 8192"):
    plan_lib.plan(config, 8, 80.0, compile_step=False)
  config.analysis.record_every = 0  # no routing records: no sample to split
  assert plan_lib.plan(config, 8, 80.0, compile_step=False)["num_groups"] == 64


def test_automatic_groups_follow_the_planned_devices_and_keep_a_given_number():
  config = preset("mt_paper")
  assert config.model.moe.num_groups == 0
  assert [plan_lib.plan(config, d, 80.0, compile_step=False)["num_groups"] for d in (2, 16)] == [2, 16]
  config.model.moe.num_groups = 4
  assert plan_lib.plan(config, 2, 80.0, compile_step=False)["num_groups"] == 4
  with pytest.raises(ConfigError, match="model.moe.num_groups=4 must be a multiple of the 8 devices"):
    plan_lib.plan(config, 8, 80.0, compile_step=False)


def _one_error_line(run: subprocess.CompletedProcess) -> str:
  assert run.returncode == 2, run.stderr[-3000:]
  assert "Traceback" not in run.stderr, run.stderr[-3000:]
  errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, run.stderr[-3000:]
  return errors[0]


def _launch(config: str, workdir: pathlib.Path, *overrides: str, devices: int = 8, data_dir: str | None = None):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(devices)}
  if data_dir is not None:
    env["STABLEMOE_DATA_DIR"] = data_dir
  return subprocess.run([sys.executable, "-m", "stablemoe_jax.main", "--config", config, "--workdir", str(workdir),
                         "--config.train.steps=1", "--config.train.stage1_steps=0", "--config.train.warmup_steps=0",
                         *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("config, command", [
    ("configs/lm_base.py", "`python -m stablemoe_jax.prepare --config configs/lm_base.py --workdir {w} "
                           "--workers 8 --config.data.train_files='GLOB' --config.data.valid_files='GLOB' "
                           "--config.data.test_files='GLOB'`"),
    ("configs/lm_large.py", "`python -m stablemoe_jax.prepare --config configs/lm_large.py --workdir {w} "),
    ("configs/lm_files.py:lm_base", "`python -m stablemoe_jax.prepare --config configs/lm_files.py:lm_base "),
    ("configs/mt_wmt.py", "`python -m stablemoe_jax.data.wmt --tfds_data_dir=DIR --pairs=fr-en,cs-en,de-en,"),
])
def test_a_paper_preset_without_its_corpus_stops_on_8_devices_before_preparing_anything(config, command, tmp_path):
  """A one-step launch on 8 CPU devices with PTB where the run would find it: exit 2, one line naming the command
  that prepares the preset's corpus, and nothing written (no data, no checkpoint)."""
  workdir = tmp_path / "run"
  line = _one_error_line(_launch(config, workdir))
  assert command.format(w=workdir) in line, line
  assert not workdir.exists()


def test_a_config_error_on_8_devices_ends_with_exit_2_before_the_data(ptb_dir, tmp_path):
  """The default's data is PTB, which the run would tokenize first; a routing sample of 3 rows cannot be split over
  8 devices, and the launch says so before that."""
  workdir = tmp_path / "run"
  line = _one_error_line(_launch("configs/default.py", workdir, "--config.analysis.sample_tokens=384",
                                 data_dir=str(ptb_dir)))
  assert "(= 384 // 128 = 3 rows of the routing sample) must be a multiple of the number of devices (8)" in line
  assert not workdir.exists()


def test_a_prepared_lm_files_corpus_is_not_refused(tmp_path):
  """The preparation check reads the prepared manifest (here a stand-in): with it, a run goes on to read the shards."""
  config = preset("lm_base")
  config.data.train_files = "/nonexistent/train-*.txt"
  with pytest.raises(DataNotFoundError, match=r"--config.data.train_files='/nonexistent/train-\*.txt' "
                                              r"--config.data.valid_files='GLOB'"):
    loop.Experiment(config, tmp_path / "run")
  assert not (tmp_path / "run").exists()
  data = tmp_path / "prepared" / "data"
  data.mkdir(parents=True)
  (data / "prepared.json").write_text(json.dumps({"format": "shards"}))
  from stablemoe_jax.experiment import config_validation  # pylint: disable=import-outside-toplevel
  config_validation.check_prepared(config, tmp_path / "prepared")  # no error


def test_a_cpu_launch_whose_state_cannot_fit_the_host_stops_with_one_line(ptb_dir):
  """On CPU devices each device's copy of the state lies in host memory: parameters, gradients and Adam's two
  moments, 4 float32 values a parameter, times the devices (here every parameter replicated)."""
  import re  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from tests.conftest import jit_init  # pylint: disable=import-outside-toplevel

  from stablemoe_jax.tasks import make_task  # pylint: disable=import-outside-toplevel
  config = make_tiny_config(ptb_dir)
  config.model.vocab_size, config.model.moe.num_groups = 1000, 8
  settings = from_config(config)
  task = make_task(settings)
  params = jit_init(task.build_model(settings.model), 0, *task.sample_inputs(settings), jax.numpy.array(True))["params"]
  per_device = 4 * 4 * sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))  # the reference, by hand
  plan_lib.check_host_memory(config, 8, 8, available=8 * per_device + 4096)  # fits (Adam's step count aside)
  with pytest.raises(ConfigError) as error:
    plan_lib.check_host_memory(config, 8, 8, available=8 * per_device - 4096)
  gib = [float(x) for x in re.findall(r"([0-9.]+) GiB", str(error.value))]
  assert gib[:2] == [round(8 * per_device / 2**30, 1), round(per_device / 2**30, 2)]
  assert "on its 8 CPU device(s)" in str(error.value) and "\n" not in str(error.value)
  plan_lib.check_host_memory(config, 8, 1, available=per_device + 4096)  # one process's share: 1 of the 8 devices


# --- the automatic routing groups, recorded by the run --------------------------------------------------------------

def test_the_groups_a_checkpoint_was_written_with_are_read_back(tmp_path):
  """``saved_num_groups`` reads the files ``Checkpointer.save`` writes (the latest complete step), no manager."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel
  directory = tmp_path / "checkpoints"
  assert loop.ckpt_lib.saved_num_groups(directory) is None
  for step, groups in ((2, 4), (6, 8)):
    config = ml_collections.ConfigDict({"model": {"moe": {"num_groups": groups}}, "data": {}})
    checkpointer = loop.ckpt_lib.Checkpointer(directory, config)
    checkpointer.save(step, {"w": jnp.ones(3)}, {"next_index": step})
    checkpointer.wait()
    checkpointer.close()
  (directory / "9.orbax-checkpoint-tmp-1").mkdir()  # an unfinished save: not a step
  assert loop.ckpt_lib.saved_num_groups(directory) == 8
  assert loop.ckpt_lib.saved_config(directory)["model"]["moe"]["num_groups"] == 8


TRAIN_ON_TWO = """
import json, sys
sys.path.insert(0, {repo!r})
from tests.integration.test_presets import groups_config
from stablemoe_jax.experiment import loop
config = groups_config({data!r})
print("STOPPED" + json.dumps(loop.train_and_evaluate(config, {workdir!r}, stop_at_step=5)))
print("EVAL" + json.dumps(loop.evaluate_checkpoint(config, {workdir!r}, step=4)))
"""


def groups_config(data_dir):
  """The tiny config with the automatic groups (the default's 0) and a capacity limit at evaluation, so that the
  number of groups changes the evaluation loss (tokens over a group's capacity pass through the layer unchanged);
  a learning rate high enough for the layer to matter after 4 steps."""
  config = make_tiny_config(data_dir)
  assert config.model.moe.num_groups == 0
  config.train.steps, config.train.stage1_steps, config.train.checkpoint_every = 6, 3, 2
  config.model.moe.eval_capacity_factor = 0.25
  config.train.learning_rate = 3e-2
  return config


@pytest.mark.slow
def test_automatic_groups_are_recorded_and_a_resumption_or_evaluation_on_one_device_routes_as_on_two(
    ptb_dir, prepared_ptb, tmp_path):
  workdir = tmp_path / "run"
  share_prepared_ptb(prepared_ptb, workdir, tmp_path / "one_group")
  env = {**os.environ, "XLA_FLAGS": xla_flags(2), "JAX_PLATFORMS": "cpu"}
  code = TRAIN_ON_TWO.format(repo=str(REPO), data=str(ptb_dir), workdir=str(workdir))
  run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  on_two = json.loads(run.stdout.split("EVAL")[-1])
  assert json.loads((workdir / "config.json").read_text())["model"]["moe"]["num_groups"] == 2  # recorded

  import jax  # pylint: disable=import-outside-toplevel
  assert jax.device_count() == 1
  config = groups_config(ptb_dir)
  on_one = loop.evaluate_checkpoint(config, workdir, step=4)  # 0 -> the 2 groups of the checkpoint, not 1
  assert on_one["tokens"] == on_two["tokens"]
  assert on_one["loss"] == pytest.approx(on_two["loss"], abs=2e-5)
  # Independent of the record: one group routes differently (with capacity 0.5 more tokens overflow), and a
  # checkpoint of 2 groups is refused to a config that asks for 1.
  config.model.moe.num_groups = 1
  with pytest.raises(CheckpointMismatchError, match="num_groups: checkpoint 2, this config 1"):
    loop.evaluate_checkpoint(config, workdir, step=4)
  trained, one_group = loop.Experiment(groups_config(ptb_dir), workdir), loop.Experiment(config, tmp_path / "one_group")
  try:
    _, state = trained.restore_for_evaluation(4)
    assert trained.config.model.moe.num_groups == 2 and one_group.config.model.moe.num_groups == 1
    evaluated = one_group.evaluate(state.params, "valid", one_group.final_eval_batches)
  finally:
    trained.checkpointer.close()
    one_group.checkpointer.close()
  # Measured: the two evaluations of the 2 groups agree exactly (1 and 2 devices), one group is 4.2e-4 away.
  assert evaluated["tokens"] == on_two["tokens"] and abs(evaluated["loss"] - on_two["loss"]) > 1e-4

  summary = loop.train_and_evaluate(groups_config(ptb_dir), workdir)  # resumed from step 4 on one device
  assert summary.steps == 6 and summary.num_groups == 2
  assert json.loads((workdir / "config.json").read_text())["model"]["moe"]["num_groups"] == 2

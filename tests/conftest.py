"""Shared fixtures: the real corpora in ../shared/data and a tiny, fast config."""
from __future__ import annotations

import os
import pathlib
import sys

import pytest

from configs import default

REPO = pathlib.Path(__file__).resolve().parents[1]
MAIN = [sys.executable, "-m", "stablemoe_jax.main", "--config", "configs/default.py"]  # run from REPO
SHARED_DATA = pathlib.Path(os.environ.get("STABLEMOE_DATA_DIR") or
                           pathlib.Path(__file__).resolve().parents[2] / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def ptb_dir() -> pathlib.Path:
  if not (SHARED_DATA / "ptb" / "ptb.train.txt").is_file():
    pytest.fail(f"Penn Treebank not found under {SHARED_DATA}; set STABLEMOE_DATA_DIR to the shared data folder.")
  return SHARED_DATA


def make_tiny_config(data_dir: pathlib.Path):
  """The default config shrunk to seconds per run: 2 blocks, d=32, 4 experts, 4 x 16 tokens a step."""
  config = default.get_config()
  config.data.data_dir = str(data_dir)
  model = config.model
  model.d_model, model.num_heads, model.num_layers, model.d_ff, model.max_len = 32, 2, 2, 64, 16
  model.dropout = 0.1
  model.moe.num_experts, model.moe.sublayers_per_expert = 4, 2
  model.moe.distilled_router.dim = 8
  train = config.train
  train.steps, train.stage1_steps, train.warmup_steps = 12, 5, 2
  train.batch_size, train.seq_len = 4, 16
  train.learning_rate = 3e-3
  train.log_every, train.eval_every, train.eval_batches = 2, 6, 2
  train.checkpoint_every, train.keep_checkpoints = 4, 10
  config.eval.batch_size, config.eval.seq_len = 64, 16
  return config


@pytest.fixture
def tiny_config(ptb_dir):
  return make_tiny_config(ptb_dir)


def tiny_flags(steps: int, stage1_steps: int, warmup_steps: int, log_every: int, checkpoint_every: int) -> list[str]:
  """Command-line overrides that shrink configs/default.py to a tiny model, as a user would type them."""
  return ["--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.num_layers=2",
          "--config.model.d_ff=64", "--config.model.max_len=16", "--config.model.moe.num_experts=4",
          f"--config.train.steps={steps}", f"--config.train.stage1_steps={stage1_steps}",
          f"--config.train.warmup_steps={warmup_steps}", "--config.train.batch_size=4",
          "--config.train.seq_len=16", "--config.eval.seq_len=16", f"--config.train.log_every={log_every}",
          "--config.train.eval_every=1000", f"--config.train.checkpoint_every={checkpoint_every}"]

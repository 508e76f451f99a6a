"""The paper's WMT setting (configs/mt_wmt.py, data/wmt.py): validated and planned offline; preparing or training
without its TFDS data stops with one line naming the builders."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

from configs import mt_wmt
from stablemoe_jax.config_validation import ConfigError, validate_config
from stablemoe_jax.data import wmt

MAIN = [sys.executable, "-m", "stablemoe_jax.main", "--config", "configs/mt_wmt.py"]


def test_wmt_config_is_valid_and_names_the_paper_pairs(tmp_path):
  config = mt_wmt.get_config()
  validate_config(config)
  assert config.data.pairs == "fr-en,cs-en,de-en,fi-en,lv-en,et-en,ro-en,hi-en,tr-en"
  assert wmt.builder_name("fr-en") == "wmt15_translate/fr-en:1.0.0"
  config.data.pairs = "fr-en,xx-en"
  with pytest.raises(ConfigError, match="unknown WMT pair.*xx-en"):
    validate_config(config)
  # A pair counts as prepared once TFDS wrote its dataset_info.json.
  config.data.pairs, config.data.tfds_data_dir = "fr-en,hi-en", str(tmp_path)
  (wmt.prepared_path(tmp_path, "hi-en")).mkdir(parents=True)
  (wmt.prepared_path(tmp_path, "hi-en") / "dataset_info.json").write_text("{}")
  assert wmt.missing_pairs(config.data) == ["fr-en"]


def _one_error_line(run: subprocess.CompletedProcess) -> str:
  assert run.returncode == 2, run.stderr[-2000:]
  assert "Traceback" not in run.stderr
  errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, run.stderr[-2000:]
  return errors[0]


@pytest.mark.slow
def test_wmt_offline_plans_and_stops_with_one_line(tmp_path):
  plan = subprocess.run([*MAIN, "--workdir", str(tmp_path / "plan"), "--mode=plan", "--plan_devices=8"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert plan.returncode == 0 and "plan: 8 devices" in plan.stdout, plan.stderr[-2000:]
  train = subprocess.run([*MAIN, "--workdir", str(tmp_path / "train")], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
  line = _one_error_line(train)
  assert "python -m stablemoe_jax.data.wmt" in line and "wmt14_translate/hi-en:1.0.0" in line
  prepare = subprocess.run([sys.executable, "-m", "stablemoe_jax.data.wmt", "--tfds_data_dir", str(tmp_path / "tfds"),
                            "--pairs=hi-en"], cwd=REPO, capture_output=True, text=True, timeout=300)
  line = _one_error_line(prepare)
  assert "wmt18_translate/tr-en:1.0.0" in line and "network" in line

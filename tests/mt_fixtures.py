"""Translation test helpers: small slices of the real parallel corpora and a tiny translation config."""
from __future__ import annotations

import itertools
import json
import pathlib
import shutil

import ml_collections
import pytest
from tests.conftest import SHARED_DATA

from configs import mt_cpu
from stablemoe_jax.compare import runner
from stablemoe_jax.compare.methods import method_configs
from stablemoe_jax.compare.comparison import Comparison

MULTI30K_LINES = {"train": 2000, "val": 64}  # every test set: its first 64 lines
BIBLE_BOOKS = ("Gen", "Exod", "Ruth", "Jonah")  # Ruth and Jonah are held out in the tiny config


def multi30k_lines(name: str, start: int, count: int) -> list[str]:
  """Lines ``start`` to ``start + count`` of the shared Multi30k file ``name`` (e.g. ``train.de``), without their ends."""
  path = SHARED_DATA / "multi30k" / name
  if not path.is_file():
    pytest.fail(f"Multi30k not found under {SHARED_DATA}; set STABLEMOE_DATA_DIR to the shared data folder.")
  with path.open(encoding="utf-8") as f:
    return [line.rstrip("\n") for line in itertools.islice(f, start, start + count)]


def write_small_corpora(root: pathlib.Path) -> pathlib.Path:
  """Copies the first lines of every Multi30k file and the Bible's verses of BIBLE_BOOKS into ``root``."""
  source = SHARED_DATA
  if not (source / "multi30k" / "train.de").is_file():
    pytest.fail(f"Multi30k not found under {source}; set STABLEMOE_DATA_DIR to the shared data folder.")
  (root / "multi30k").mkdir(parents=True)
  for path in sorted((source / "multi30k").iterdir()):
    lines = MULTI30K_LINES.get(path.name.split(".")[0], 64)
    with path.open(encoding="utf-8") as f:
      (root / "multi30k" / path.name).write_text("".join(itertools.islice(f, lines)), encoding="utf-8")
  (root / "bible_es_en").mkdir()
  keys = (source / "bible_es_en" / "keys.txt").read_text(encoding="utf-8").splitlines()
  keep = [i for i, key in enumerate(keys) if key.split(".")[0] in BIBLE_BOOKS]
  for name in ("bible.es", "bible.en", "keys.txt"):
    lines = (source / "bible_es_en" / name).read_text(encoding="utf-8").splitlines()
    (root / "bible_es_en" / name).write_text("".join(lines[i] + "\n" for i in keep), encoding="utf-8")
  return root


def make_tiny_mt_config(data_dir: pathlib.Path | str):
  """configs/mt_cpu.py shrunk to seconds: d=32, 2 + 2 blocks, 4 experts, 8 x 32 positions a step."""
  config = mt_cpu.get_config()
  config.data.data_dir = str(data_dir)
  config.data.sentencepiece_vocab_size = 600
  config.data.bible_valid_books, config.data.bible_test_books = "Ruth", "Jonah"
  model = config.model
  model.d_model, model.num_heads, model.num_layers, model.d_ff, model.max_len = 32, 2, 2, 64, 32
  model.moe.num_experts = 4
  model.moe.distilled_router.dim = 8
  train = config.train
  train.steps, train.stage1_steps, train.warmup_steps = 12, 5, 3
  train.batch_size, train.seq_len = 8, 32
  train.learning_rate = 3e-3
  train.log_every, train.eval_every, train.eval_batches = 2, 6, 2
  train.checkpoint_every, train.keep_checkpoints = 4, 10
  config.eval.batch_size, config.eval.seq_len, config.eval.max_sentences = 16, 32, 16
  config.analysis.record_every, config.analysis.report_at_end = 0, False  # the analysis tests turn them on
  return config


def tiny_model_config(vocab_size: int = 40, router: str = "stablemoe"):
  """The tiny translation model config with a fixed vocabulary (no data needed), dropout off."""
  config = make_tiny_mt_config("")
  config.model.vocab_size = vocab_size
  config.model.dropout = 0.0
  config.model.moe.router = router
  return config


def shared_run_config(corpora: pathlib.Path):
  """The one tiny StableMoE translation run that tests share (``mt_shared_run``): 12 steps, stage 2 from step 7,
  routing records every 2 steps of 8 validation pairs, greedy BLEU on each set's first 8 sentences."""
  config = make_tiny_mt_config(corpora)
  config.train.stage1_steps = 6
  config.analysis.record_every, config.analysis.sample_tokens = 2, 8 * config.train.seq_len
  config.analysis.report_at_end = True
  config.decode.beam_size, config.eval.max_sentences = 1, 8
  config.compare = ml_collections.ConfigDict({"methods": "stablemoe", "seeds": 1})
  return config


def train_shared_run(root: pathlib.Path) -> pathlib.Path:
  """Trains the shared run as the comparison runner lays it out: ``root/compare/{data, stablemoe/seed0}``.

  Done once per test session, under a lock that xdist's workers share; a finished run is found and kept.
  """
  compare_dir = root / "compare"
  if not (compare_dir / "stablemoe" / "seed0" / "summary.json").is_file():
    if root.exists():  # a run interrupted by a failure: start over
      shutil.rmtree(root)
    root.mkdir(parents=True)
    config = shared_run_config(write_small_corpora(root / "corpora"))
    runner.run_all(Comparison.of(config), compare_dir, log=lambda *a, **k: None)
  return compare_dir


def copy_shared_run(compare_dir: pathlib.Path, destination: pathlib.Path):
  """A private copy of the shared run (tests that rewrite its files must not race each other across workers).

  Returns (the run's config, its comparison folder, its run folder, its summary)."""
  shutil.copytree(compare_dir, destination, symlinks=True)
  config = shared_run_config(compare_dir.parent / "corpora")
  run_config = method_configs(Comparison.of(config))["stablemoe"]
  run = destination / "stablemoe" / "seed0"
  return run_config, destination, run, json.loads((run / "summary.json").read_text())

"""Translation test helpers: small slices of the real parallel corpora and a tiny translation config."""
from __future__ import annotations

import itertools
import pathlib

import pytest
from conftest import SHARED_DATA

from configs import mt_cpu

MULTI30K_LINES = {"train": 2000, "val": 64}  # every test set: its first 64 lines
BIBLE_BOOKS = ("Gen", "Exod", "Ruth", "Jonah")  # Ruth and Jonah are held out in the tiny config


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
  return config


def tiny_model_config(vocab_size: int = 40, router: str = "stablemoe"):
  """The tiny translation model config with a fixed vocabulary (no data needed), dropout off."""
  config = make_tiny_mt_config("")
  config.model.vocab_size = vocab_size
  config.model.dropout = 0.0
  config.model.moe.router = router
  return config

"""A language model on your own corpus at any size, prepared by `python -m stablemoe_jax.prepare`.

`--config configs/lm_files.py` (the default model) or `--config configs/lm_files.py:lm_base` (the paper's base
LM); give the inputs as comma-separated globs of plain text, `.gz` or `.zst` (one sentence or document a line):

  python -m stablemoe_jax.prepare --config configs/lm_files.py:lm_base --workdir runs/base --workers 16 \
    --config.data.train_files='/data/cc100/train-*.txt.zst' --config.data.valid_files=/data/valid.txt \
    --config.data.test_files=/data/test.txt
  python -m stablemoe_jax.main --config configs/lm_files.py:lm_base --workdir runs/base (same data overrides)
"""
import importlib


def get_config(base: str = "default"):
  config = importlib.import_module(f"configs.{base}").get_config()
  config.data.corpus = "files"
  config.data.tokenizer = "sentencepiece"
  config.data.train_files = ""
  config.data.valid_files = ""
  config.data.test_files = ""
  config.data.tokenizer_files = ""  # globs of train files the tokenizer is built from; "": every train file
  # Named held-out sets, each scored on its own at the end (summary.json "sets"): "NAME=GLOB,..." with {split} in
  # each glob standing for valid and test (stablemoe_jax/data/lm/eval_sets.py); "": none.
  config.data.eval_sets = ""
  return config

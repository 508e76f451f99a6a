"""Translation on your own parallel corpora (X->English, any size), prepared by `python -m stablemoe_jax.prepare`.

`--config configs/mt_files.py` (the CPU preset's model, configs/mt_cpu.py) or `configs/mt_files.py:mt_paper` (the
paper's). Name the pairs and, per split, comma-separated globs of plain text, `.gz` or `.zst` files, one sentence a
line, in which `{pair}` stands for the pair (`xx-en`) and `{lang}` for the source code (`xx`: the source files) or the
target code (`en`: the target files); the i-th source file of a glob pairs with its i-th target file:

  python -m stablemoe_jax.prepare --config configs/mt_files.py --workdir runs/mt_mine --workers 2 \
    --config.data.pairs=xx-en,yy-en --config.data.train_files='/data/{pair}/train.*.{lang}.zst' \
    --config.data.valid_files='/data/{pair}/dev.{lang}' --config.data.test_files='/data/{pair}/test.{lang}'
  python -m stablemoe_jax.main --config configs/mt_files.py --workdir runs/mt_mine (the same data overrides)

Each pair's sets are `train`, `valid` and `test`; the source files of a pair must have as many lines as its target
files (one error naming both otherwise).
"""
import importlib

import ml_collections


def get_config(base: str = "mt_cpu") -> ml_collections.ConfigDict:
  config = importlib.import_module(f"configs.{base}").get_config()
  previous = config.data
  config.data = ml_collections.ConfigDict()
  config.data.corpus = "files"
  config.data.pairs = ""  # "xx-en,yy-en": SOURCE-TARGET codes (the source's tag is __xx__), one target language
  config.data.train_files = ""  # globs with {lang} (and {pair}), e.g. '/data/{pair}/train.*.{lang}'
  config.data.valid_files = ""
  config.data.test_files = ""
  config.data.sentencepiece_vocab_size = previous.sentencepiece_vocab_size  # one joint model, sources + targets
  config.data.sampling_temperature = previous.sampling_temperature  # pair weight ~ n_pair^(1/T)
  return config

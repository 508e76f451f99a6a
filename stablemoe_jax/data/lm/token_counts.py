"""Token-id frequencies of a prepared split (for routers built from the training data, e.g. balanced Hash)."""
from __future__ import annotations

import numpy as np

from stablemoe_jax.data.lm.pipeline import LMData


def split_token_counts(data: LMData, vocab_size: int, split: str = "train") -> np.ndarray:
  """How often each token id occurs in ``split``'s stream (line ids + eos): int64 [vocab_size]."""
  stream = data.stream(split)
  tokens = np.asarray(stream.read(0, len(stream)))
  return np.bincount(tokens, minlength=vocab_size)[:vocab_size]

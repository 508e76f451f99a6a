"""Translation batches from encoded sets: mixed-pair training batches in length buckets, and evaluation batches.

The rows themselves (one pair a row, or packed) are ``rows.py``'s; every batch has its fixed shapes: ``source``,
``decoder_inputs``, ``targets`` int32 [B, L] and ``weights`` float32 [B, L], with L = ``train.seq_len``
(``eval.seq_len``). A pair whose source or target does not fit L is never trained on or scored. ``pipeline.py``
prepares and loads the encoded sets these batches are drawn from.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from stablemoe_jax.core.errors import DataError
from stablemoe_jax.data.translation.rows import (  # noqa: F401  (re-exported: the batches' callers name them here)
    PACKING_KEYS, Batch, EncodedSet, Picks, _flatten, encode_set, first_fit, make_rows, pack_rows)


def mixing_weights(sizes: list[int], temperature: float) -> np.ndarray:
  """Sampling probability of each pair, proportional to ``n_pair ** (1 / temperature)`` (1: proportional)."""
  scaled = np.asarray(sizes, np.float64) ** (1.0 / temperature)
  return scaled / scaled.sum()


def length_buckets(count: int, max_len: int) -> tuple[int, ...]:
  """The ``count`` bucket lengths of training batches, each half the next: (16, 32, 64) for 3 and 64; (64,) for 1.

  Raises:
    ValueError: ``count`` < 1, or ``max_len`` not divisible by 2 ** (count - 1) (the message names the fix).
  """
  if count < 1 or max_len % 2 ** (count - 1):
    raise ValueError(f"data.length_buckets={count} needs train.seq_len={max_len} divisible by 2**{count - 1}; set "
                     f"--config.data.length_buckets to between 1 (no buckets) and the number of times "
                     f"{max_len} halves evenly, plus one.")
  return tuple(max_len >> k for k in reversed(range(count)))


class MixedPairIterator:
  """Endless training batches mixing the pairs; batch t depends only on (seed, t), so resuming is exact.

  Each global row draws its pair with ``mixing_weights`` and then one of that pair's fitting training
  pairs uniformly (with replacement); this process keeps rows ``shard_index`` * B / shard_count onwards.
  ``get_state`` / ``set_state`` (the number of batches drawn) are what the checkpoint saves.

  Length buckets (``length_buckets``, each dividing ``max_len``): a pair belongs to the shortest bucket L
  its source and target fit, and a batch is [B * max_len / L, L] of one bucket, so every batch has the same
  B * max_len positions but far less padding. Bucket L is drawn with probability proportional to L times the
  sampling mass of its pairs, which keeps every sentence's share of the rows that of one bucket (above); a
  batch then carries max_len / sum_L(L * mass_L) times as many rows on average. Bucket L's pair is drawn with
  weight ~ its mass in L, then a sentence uniformly among its pairs in L. One bucket: batches [B, max_len],
  drawn exactly as without buckets.

  ``pack`` (one bucket only): pairs are drawn as with one bucket, in turn, and packed (``pack_rows``) into the
  batch's B rows until one fits no row, so a batch holds as many pairs as its positions take (configs/mt_cpu.py:
  about 165 a batch, 83% of target positions real, against 123 and 62% in three buckets).
  """

  def __init__(self, train_sets: list[EncodedSet], batch_size: int, max_len: int, seed: int,
               temperature: float, shard_index: int = 0, shard_count: int = 1,
               length_buckets: tuple[int, ...] = (), pack: bool = False):
    if batch_size % shard_count:
      raise ValueError(f"train.batch_size={batch_size} must be a multiple of the {shard_count} processes.")
    if pack and len(length_buckets) > 1:
      raise ValueError("packed batches take one length bucket: set data.length_buckets=1 with data.pack_pairs.")
    self._pack = pack
    self._sets = train_sets
    self._buckets = tuple(length_buckets) or (max_len,)
    fitting = [[s.fitting(b) for b in self._buckets] for s in train_sets]  # [pair][bucket]: fits b
    for s, per_bucket in zip(train_sets, fitting):
      if not len(per_bucket[-1]):
        raise DataError(f"no training pair of {s.pair} fits train.seq_len={max_len}; raise it.")
    self._weights = mixing_weights([len(f[-1]) for f in fitting], temperature)
    # [pair][bucket]: the pairs whose shortest fitting bucket is b.
    self._indices = [[np.setdiff1d(f[b], f[b - 1], assume_unique=True) if b else f[0]
                      for b in range(len(self._buckets))] for f in fitting]
    mass = np.array([[w * len(idx) / len(f[-1]) for idx in per_bucket]
                     for w, per_bucket, f in zip(self._weights, self._indices, fitting)])  # [pair, bucket]
    self._bucket_probs = mass.sum(0) * np.asarray(self._buckets) / (mass.sum(0) * self._buckets).sum()
    self._pair_probs = [mass[:, b] / mass[:, b].sum() if mass[:, b].sum() else None
                        for b in range(len(self._buckets))] if len(self._buckets) > 1 else [self._weights]
    self._batch_size, self._max_len, self._seed = batch_size, max_len, seed
    self._shard_index, self._shard_count = shard_index, shard_count
    self._batches = 0

  @property
  def weights(self) -> dict[str, float]:
    return {s.pair: float(w) for s, w in zip(self._sets, self._weights)}

  def __iter__(self):
    return self

  def __next__(self) -> Batch:
    if self._pack:
      return self.next_packed()[0]
    picks, length = self.draw()
    return make_rows(picks, len(picks), length)

  def next_packed(self) -> tuple[Batch, Picks]:
    """The next packed batch of this process's rows and the picks of the whole batch's pairs; advances the
    iterator. Candidates are drawn as one bucket's rows are, as many as could ever fit (B * L / 2: a source is
    at least tag + eos), and packed in draw order."""
    rng = np.random.default_rng([self._seed, self._batches])
    picks = self._draw_pairs(rng, 0, self._batch_size * self._max_len // 2 + 1)
    self._batches += 1
    batch, used = pack_rows(picks, self._batch_size, self._max_len)
    rows = slice(self._shard_index * self._batch_size // self._shard_count,
                 (self._shard_index + 1) * self._batch_size // self._shard_count)
    return {name: value[rows] for name, value in batch.items()}, picks[:used]

  def _draw_pairs(self, rng: np.random.Generator, bucket: int, rows: int) -> Picks:
    """``rows`` (set, index) picks of bucket ``bucket``: a pair by its weight, then one of its sentences."""
    pairs = rng.choice(len(self._sets), size=rows, p=self._pair_probs[bucket])
    # One bounded draw per row, as a draw per row would (numpy's Generator draws an array of bounds element by
    # element: tests/data/translation/test_mt_rows.py checks the picks against the per-row draws).
    per_pair = [self._indices[p][bucket] for p in range(len(self._sets))]
    choice = rng.integers(np.array([len(idx) for idx in per_pair])[pairs])
    indices = np.zeros(rows, np.int64)
    for p, idx in enumerate(per_pair):
      where = pairs == p
      indices[where] = idx[choice[where]]
    return Picks(tuple(self._sets), pairs, indices)

  def draw(self) -> tuple[Picks, int]:
    """The next batch's (set, index) picks of this process and its bucket length; advances the iterator."""
    rng = np.random.default_rng([self._seed, self._batches])
    bucket = 0 if len(self._buckets) == 1 else int(rng.choice(len(self._buckets), p=self._bucket_probs))
    length = self._buckets[bucket]
    rows = self._batch_size * (self._max_len // length)
    picks = self._draw_pairs(rng, bucket, rows)
    self._batches += 1
    mine = picks[self._shard_index * rows // self._shard_count:(self._shard_index + 1) * rows // self._shard_count]
    return mine, length

  def get_state(self) -> dict:
    return {"batches": self._batches}

  def set_state(self, state: dict) -> None:
    self._batches = int(state["batches"])


def eval_batches(sets: list[EncodedSet], batch_size: int, max_len: int, max_sentences: int = 0,
                 pack: bool = False) -> Iterator[Batch]:
  """Batches of every fitting pair of ``sets`` in order (the last one padded with empty rows).

  ``max_sentences > 0`` takes each set's first ``max_sentences`` pairs only. ``pack``: the pairs in the same order
  packed into the rows (``pack_rows``), each batch taking as many as fit, so fewer batches score the same pairs.
  """
  picks = []
  for s in sets:
    indices = s.fitting(max_len)
    if max_sentences > 0:
      indices = indices[indices < max_sentences]
    picks += [(s, int(i)) for i in indices]
  if pack:
    remaining = Picks.from_pairs(picks) if picks else None
    while remaining is not None and len(remaining):
      batch, used = pack_rows(remaining, batch_size, max_len)
      remaining = remaining[used:]
      yield batch
    return
  for start in range(0, len(picks), batch_size):
    yield make_rows(picks[start:start + batch_size], batch_size, max_len)

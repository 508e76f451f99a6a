"""Translation rows from encoded sets: the encoded sets themselves, rows of one pair each (``make_rows``) and rows
packed with several pairs (``pack_rows``).

A source is ``[__xx__] + ids + [eos]``; the decoder input ``[bos] + target ids``; the targets ``target ids +
[eos]``. Every batch has fixed shapes: ``source``, ``decoder_inputs``, ``targets`` int32 [B, L] and ``weights``
float32 [B, L] (1 at scored target positions), pad id 0; packed rows add ``PACKING_KEYS`` int32 [B, L].
"""
from __future__ import annotations

import dataclasses

import numpy as np

from stablemoe_jax.core.constants import PAD_ID
from stablemoe_jax.data.translation import corpora as parallel
from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, EOS_ID, JointSentencePiece
from stablemoe_jax.data.translation.pair_records import Segments, copy_segments, fitting_pairs

Batch = dict[str, np.ndarray]


@dataclasses.dataclass
class EncodedSet:
  """One named set of one pair, encoded: source i is ``source_ids[source_offsets[i]:source_offsets[i + 1]]``.

  Sources include the language tag and eos; targets are the bare ids (no bos, no eos).
  """

  pair: str
  name: str
  source_ids: np.ndarray  # int32 [total source tokens]
  source_offsets: np.ndarray  # int64 [n + 1]
  target_ids: np.ndarray
  target_offsets: np.ndarray

  def __len__(self) -> int:
    return len(self.source_offsets) - 1

  @property
  def source_lengths(self) -> np.ndarray:
    """int64 [n]: each source's ids (as ``pair_records.RecordSet.source_lengths``)."""
    return np.diff(self.source_offsets)

  @property
  def target_lengths(self) -> np.ndarray:
    """int64 [n]: each target's ids, bos and eos not counted."""
    return np.diff(self.target_offsets)

  def source(self, i: int) -> np.ndarray:
    return self.source_ids[self.source_offsets[i]:self.source_offsets[i + 1]]

  def target(self, i: int) -> np.ndarray:
    return self.target_ids[self.target_offsets[i]:self.target_offsets[i + 1]]

  def pairs(self, indices) -> list[tuple[np.ndarray, np.ndarray]]:
    """(source, target) ids of each pair in ``indices``."""
    return [(self.source(i), self.target(i)) for i in indices]

  def segments(self, indices) -> Segments:
    """Where the pairs of ``indices`` lie: (source ids, int64 [n] starts, int64 [n] lengths, target ids, starts,
    lengths), pair i's source ``source_ids[starts[i]:][:lengths[i]]`` (nothing copied)."""
    indices = np.asarray(indices, np.int64)
    out = []
    for ids, offsets in ((self.source_ids, self.source_offsets), (self.target_ids, self.target_offsets)):
      starts = offsets[indices]
      out += [ids, starts, offsets[indices + 1] - starts]
    return tuple(out)

  def fitting(self, max_len: int) -> np.ndarray:
    """int64 indices of the pairs whose source and target (+ bos / eos) fit ``max_len`` positions."""
    return fitting_pairs(self.source_lengths, self.target_lengths, max_len)


def _flatten(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  offsets = np.zeros(len(rows) + 1, np.int64)
  offsets[1:] = np.cumsum([len(r) for r in rows])
  flat = np.fromiter((i for r in rows for i in r), np.int32, count=int(offsets[-1]))
  return flat, offsets


def encode_set(tokenizer: JointSentencePiece, ps: parallel.ParallelSet) -> EncodedSet:
  tag = tokenizer.tag_id(ps.source_language)
  sources = [[tag] + tokenizer.encode(line) + [EOS_ID] for line in ps.sources]
  targets = [tokenizer.encode(line) for line in ps.targets]
  return EncodedSet(ps.pair, ps.name, *_flatten(sources), *_flatten(targets))


@dataclasses.dataclass(frozen=True)
class Picks:
  """The pairs of a batch's rows as arrays: row r is pair ``indices[r]`` of ``sets[set_numbers[r]]``."""

  sets: tuple
  set_numbers: np.ndarray  # int [n]
  indices: np.ndarray  # int64 [n]

  @classmethod
  def from_pairs(cls, sets_and_indices: list[tuple[EncodedSet, int]]) -> "Picks":
    """From (set, index) pairs (the sets in order of first appearance)."""
    numbers: dict[int, int] = {}
    sets = []
    for encoded, _ in sets_and_indices:
      if id(encoded) not in numbers:
        numbers[id(encoded)] = len(sets)
        sets.append(encoded)
    set_numbers = np.fromiter((numbers[id(s)] for s, _ in sets_and_indices), np.int64, len(sets_and_indices))
    indices = np.fromiter((i for _, i in sets_and_indices), np.int64, len(sets_and_indices))
    return cls(tuple(sets), set_numbers, indices)

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, rows: slice) -> "Picks":
    return Picks(self.sets, self.set_numbers[rows], self.indices[rows])

  def pairs(self) -> list[tuple[EncodedSet, int]]:
    """As (set, index) pairs."""
    return [(self.sets[k], int(i)) for k, i in zip(self.set_numbers, self.indices)]


def make_rows(sets_and_indices: list[tuple[EncodedSet, int]] | Picks, rows: int, max_len: int) -> Batch:
  """A batch of ``rows`` rows [rows, max_len] from (set, index) pairs that fit; the rest are all padding.

  Row r: ``source`` the source ids, ``decoder_inputs`` bos + target ids, ``targets`` target ids + eos, ``weights``
  1 over the targets and eos, pad (0) after. Each set's pairs are located at once (``segments``) and copied with one
  gather and scatter a side; the decoder inputs are the targets shifted by one: no per-row Python (~8K rows a batch
  at configs/mt_paper.py's shortest bucket).

  Raises:
    ValueError: a pair does not fit ``max_len`` (its source, or its target + eos).
  """
  picks = sets_and_indices if isinstance(sets_and_indices, Picks) else Picks.from_pairs(sets_and_indices)
  # The four arrays are views of one zeroed block (PAD_ID, and weight 0.0): one allocation, one page-in.
  block = np.zeros((4, rows, max_len), np.int32)
  if PAD_ID:
    block[:3] = PAD_ID
  source, decoder_inputs, targets = block[0], block[1], block[2]
  n = len(picks)
  target_lengths = np.zeros(n, np.int64)
  for number, encoded in enumerate(picks.sets):
    where = np.flatnonzero(picks.set_numbers == number)
    if not len(where):
      continue
    source_ids, source_starts, source_lengths, target_ids, target_starts, lengths = encoded.segments(
        picks.indices[where])
    if source_lengths.max() > max_len or lengths.max() >= max_len:
      raise ValueError(f"a pair of {encoded.pair} {encoded.name} does not fit {max_len} positions (source "
                       f"{source_lengths.max()}, target + eos {lengths.max() + 1}); pass pairs that fit.")
    copy_segments(source.reshape(-1), where * max_len, source_ids, source_starts, source_lengths)
    copy_segments(targets.reshape(-1), where * max_len, target_ids, target_starts, lengths)
    target_lengths[where] = lengths
  decoder_inputs[:n, 1:] = targets[:n, :-1]  # before eos: a fitting target ends before the last position
  decoder_inputs[:n, 0] = BOS_ID
  targets[np.arange(n), target_lengths] = EOS_ID
  weights = block[3].view(np.float32)
  weights[:n] = np.arange(max_len) <= target_lengths[:, None]
  return {"source": source, "decoder_inputs": decoder_inputs, "targets": targets, "weights": weights}


# The packed batch's entries beyond ``make_rows``'s: which pair each position belongs to (1, 2, ... along a row;
# 0 = padding) and its position within that pair's source or target (model inputs of ``TransformerSeq2Seq``).
PACKING_KEYS = ("source_segments", "source_positions", "target_segments", "target_positions")


def first_fit(source_lengths: np.ndarray, target_lengths: np.ndarray, rows: int, max_len: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Places pairs in turn into the first of ``rows`` rows with room for both sides, until one fits no row.

  Args:
    source_lengths, target_lengths: int [n] positions each pair takes (target: its ids + eos), in draw order.

  Returns:
    (row, source offset, target offset), int64 [m] each, of the first m pairs (the m + 1-th fits no row, or m = n).
    Stopping at the first misfit, rather than skipping it, keeps long pairs at their drawn share but for that one
    pair per batch.
  """
  source_free, target_free = np.full(rows, max_len, np.int64), np.full(rows, max_len, np.int64)
  placed = []
  for s, t in zip(source_lengths.tolist(), target_lengths.tolist()):
    room = np.flatnonzero((source_free >= s) & (target_free >= t))
    if not len(room):
      break
    r = int(room[0])
    placed.append((r, max_len - source_free[r], max_len - target_free[r]))
    source_free[r] -= s
    target_free[r] -= t
  placed = np.asarray(placed, np.int64).reshape(-1, 3)
  return placed[:, 0], placed[:, 1], placed[:, 2]


def _segment_layout(rows_of: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, segment: np.ndarray,
                    shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
  """(segments, positions) int32 [rows, L]: ``segment[i]`` and 0.. over pair i's ``lengths[i]`` positions from
  ``offsets[i]`` in row ``rows_of[i]``; 0 elsewhere."""
  segments, positions = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
  ends = np.cumsum(lengths)
  within = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lengths, lengths)
  flat = np.repeat(rows_of * shape[1] + offsets, lengths) + within
  segments.reshape(-1)[flat] = np.repeat(segment, lengths)
  positions.reshape(-1)[flat] = within
  return segments, positions


def pack_rows(picks: Picks, rows: int, max_len: int) -> tuple[Batch, int]:
  """The pairs of ``picks``, in order, packed ``first_fit`` into ``rows`` rows [rows, max_len]; how many were used.

  Each pair keeps ``make_rows``'s layout (source; bos + target; target + eos; weights over target + eos) at its
  offsets in its row, and the ``PACKING_KEYS`` entries say which pair a position belongs to and where in it: the
  model attends only within a pair (``models/seq2seq.py``) and numbers positions from each pair's start, so a
  pair's loss is what it is alone in a row (tests/data/translation/test_mt_packing.py).

  Raises:
    ValueError: a pair does not fit ``max_len`` (as ``make_rows``).
  """
  # The lengths come from the sets' length arrays; only the pairs placed are read (``segments``: records, for
  # prepared shards), not every candidate drawn.
  source_lengths = np.zeros(len(picks), np.int64)
  target_lengths = np.zeros(len(picks), np.int64)
  for number, encoded in enumerate(picks.sets):
    where = np.flatnonzero(picks.set_numbers == number)
    source_lengths[where] = encoded.source_lengths[picks.indices[where]]
    target_lengths[where] = encoded.target_lengths[picks.indices[where]]
  if len(picks) and (source_lengths.max() > max_len or target_lengths.max() >= max_len):
    raise ValueError(f"a pair does not fit {max_len} positions (source {source_lengths.max()}, target + eos "
                     f"{target_lengths.max() + 1}); pass pairs that fit.")
  row, source_offset, target_offset = first_fit(source_lengths, target_lengths + 1, rows, max_len)
  used = len(row)
  block = np.zeros((4, rows, max_len), np.int32)
  if PAD_ID:
    block[:3] = PAD_ID
  source, decoder_inputs, targets = block[0], block[1], block[2]
  placed = picks[:used]
  for number, encoded in enumerate(placed.sets):
    where = np.flatnonzero(placed.set_numbers == number)
    if not len(where):
      continue
    source_ids, source_starts, lengths_s, target_ids, target_starts, lengths_t = encoded.segments(
        placed.indices[where])
    copy_segments(source.reshape(-1), row[where] * max_len + source_offset[where], source_ids, source_starts,
                  lengths_s)
    starts = row[where] * max_len + target_offset[where]
    copy_segments(targets.reshape(-1), starts, target_ids, target_starts, lengths_t)
    copy_segments(decoder_inputs.reshape(-1), starts + 1, target_ids, target_starts, lengths_t)
  target_lengths = target_lengths[:used]
  decoder_inputs.reshape(-1)[row * max_len + target_offset] = BOS_ID
  targets.reshape(-1)[row * max_len + target_offset + target_lengths] = EOS_ID
  segment = np.zeros(used, np.int64)  # pair i is segment k of its row if k - 1 pairs went to that row before it
  for r in np.unique(row):
    segment[row == r] = np.arange(1, np.count_nonzero(row == r) + 1)
  source_segments, source_positions = _segment_layout(row, source_offset, source_lengths[:used], segment,
                                                      (rows, max_len))
  target_segments, target_positions = _segment_layout(row, target_offset, target_lengths + 1, segment,
                                                      (rows, max_len))
  weights = block[3].view(np.float32)
  weights[:] = target_segments > 0
  batch = {"source": source, "decoder_inputs": decoder_inputs, "targets": targets, "weights": weights,
           "source_segments": source_segments, "source_positions": source_positions,
           "target_segments": target_segments, "target_positions": target_positions}
  return batch, used

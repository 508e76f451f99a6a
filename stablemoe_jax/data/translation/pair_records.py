"""Encoded sentence pairs in an array_record file, read back by random access.

Record i of a set's file is pair i, little-endian int32:

    [len(source), *source, *target]

where source = ``[__xx__] + ids + [eos]`` and target = the bare ids (as in ``batches.EncodedSet``).
The file is written with group_size:1 (one record per chunk, so reading pair i decodes pair i only), under
``NAME.tmp.PID`` and then renamed into place. The reader keeps the per-pair lengths (two int32 [n]
arrays, 8 bytes a pair) in memory, nothing else: a batch reads its B pairs from disk.
"""
from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

_INT32 = np.dtype('<i4')


def pair_record(source: np.ndarray, target: np.ndarray) -> bytes:
  return np.concatenate([[len(source)], source, target]).astype(_INT32).tobytes()


def write_pairs(path: pathlib.Path, pairs: Iterable[tuple[np.ndarray, np.ndarray]], rename: bool = True) -> int:
  """Writes ``pairs`` (source, target) to ``path``; returns the number written.

  ``rename``: write ``path.tmp.PID`` and rename it to ``path`` (else write ``path`` itself: the caller renames).
  """
  from array_record.python.array_record_module import ArrayRecordWriter

  tmp = path.with_name(f'{path.name}.tmp.{os.getpid()}') if rename else path
  writer = ArrayRecordWriter(str(tmp), 'group_size:1,uncompressed')
  count = 0
  try:
    for source, target in pairs:
      writer.write(pair_record(source, target))
      count += 1
  finally:
    writer.close()
  if rename:
    tmp.replace(path)
  return count


Segments = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def copy_segments(out: np.ndarray, out_starts: np.ndarray, ids: np.ndarray, starts: np.ndarray,
                  lengths: np.ndarray) -> None:
  """``out[out_starts[i]:][:lengths[i]] = ids[starts[i]:][:lengths[i]]`` for every i (flat ``out`` and ``ids``; int64
  [n] starts and lengths), as one gather and one scatter."""
  ends = np.cumsum(lengths)
  if not len(ends) or not ends[-1]:
    return
  positions = np.repeat(out_starts - (ends - lengths), lengths) + np.arange(ends[-1])  # in out
  out[positions] = ids[positions + np.repeat(starts - out_starts, lengths)]


class RecordSet:
  """One named set of one pair read from its array_record files (its shards, in order); the interface of
  ``batches.EncodedSet`` that training needs (``len``, ``source(i)``, ``target(i)``, ``pairs(indices)``,
  ``fitting(max_len)``).

  Memory: the per-pair lengths (int32 [n] twice) and the shards' first indices.
  """

  def __init__(self, pair: str, name: str, paths: Sequence[os.PathLike | str]):
    from array_record.python.array_record_module import ArrayRecordReader

    self.pair, self.name, self.paths = pair, name, [str(p) for p in paths]
    self._readers = [ArrayRecordReader(p) for p in self.paths]
    counts = [r.num_records() for r in self._readers]
    self._firsts = np.cumsum([0] + counts)
    self.source_lengths = np.zeros(self._firsts[-1], np.int32)
    self.target_lengths = np.zeros(self._firsts[-1], np.int32)
    for reader, first, n in zip(self._readers, self._firsts, counts):
      for start in range(0, n, 65536):  # Lengths read in slices: memory ~ one slice of records.
        for i, record in enumerate(reader.read(list(range(start, min(start + 65536, n)))), first + start):
          row = np.frombuffer(record, _INT32)
          self.source_lengths[i], self.target_lengths[i] = row[0], len(row) - 1 - row[0]

  def __len__(self) -> int:
    return len(self.source_lengths)

  def source(self, i: int) -> np.ndarray:
    return self.pairs([i])[0][0]

  def target(self, i: int) -> np.ndarray:
    return self.pairs([i])[0][1]

  def pairs(self, indices: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(source, target) int32 ids of each pair in ``indices``, with one read per shard (not per pair)."""
    indices = np.asarray(indices, np.int64)
    shards = np.searchsorted(self._firsts, indices, side='right') - 1
    rows: list[np.ndarray | None] = [None] * len(indices)
    for shard in np.unique(shards):
      where = np.flatnonzero(shards == shard)
      records = self._readers[shard].read([int(i) for i in indices[where] - self._firsts[shard]])
      for position, record in zip(where, records):
        rows[position] = np.frombuffer(record, _INT32)
    return [(row[1:1 + row[0]], row[1 + row[0]:]) for row in rows]

  def segments(self, indices: Sequence[int]) -> Segments:
    """Where the pairs of ``indices`` lie: (source ids, int64 [n] starts, int64 [n] lengths, target ids, starts,
    lengths), pair i's source ``source_ids[starts[i]:][:lengths[i]]``; one read per shard, one buffer of them."""
    indices = np.asarray(indices, np.int64)
    shards = np.searchsorted(self._firsts, indices, side='right') - 1
    records: list = [b''] * len(indices)
    for shard in np.unique(shards):
      where = np.flatnonzero(shards == shard)
      for position, record in zip(where, self._readers[shard].read([int(i) for i in indices[where] - self._firsts[shard]])):
        records[position] = record
    data = np.frombuffer(b''.join(records), _INT32)
    sizes = np.fromiter(map(len, records), np.int64, len(records)) // _INT32.itemsize
    starts = np.cumsum(sizes) - sizes  # each record: [source length, source ids, target ids]
    source_lengths = data[starts].astype(np.int64)
    return data, starts + 1, source_lengths, data, starts + 1 + source_lengths, sizes - 1 - source_lengths

  def iter_ids(self, block: int = 65536) -> Iterator[np.ndarray]:
    """Every id of the set (sources and targets), in blocks of at most `block` records."""
    for reader in self._readers:
      n = reader.num_records()
      for start in range(0, n, block):
        records = reader.read(list(range(start, min(start + block, n))))
        yield np.concatenate([np.frombuffer(r, _INT32)[1:] for r in records])

  def fitting(self, max_len: int) -> np.ndarray:
    return fitting_pairs(self.source_lengths, self.target_lengths, max_len)

  def __getstate__(self):
    return {'pair': self.pair, 'name': self.name, 'paths': self.paths}

  def __setstate__(self, state):
    self.__init__(state['pair'], state['name'], state['paths'])


def fitting_pairs(source_lengths: np.ndarray, target_lengths: np.ndarray, max_len: int) -> np.ndarray:
  """int64 indices of the pairs whose source and target (+ bos / eos) fit ``max_len`` positions."""
  return np.flatnonzero((source_lengths <= max_len) & (target_lengths + 1 <= max_len))

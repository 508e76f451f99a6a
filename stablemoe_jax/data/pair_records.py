"""Encoded sentence pairs in an array_record file, read back by random access.

Record i of a set's file is pair i, little-endian int32:

    [len(source), *source, *target]

where source = ``[__xx__] + ids + [eos]`` and target = the bare ids (as in ``translation.EncodedSet``).
The file is written with group_size:1 (one record per chunk, so reading pair i decodes pair i only), under
``NAME.tmp.PID`` and then renamed into place. The reader keeps the per-pair lengths (two int32 [n]
arrays, 8 bytes a pair) in memory, nothing else: a batch reads its B pairs from disk.
"""
from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable

import numpy as np

_INT32 = np.dtype('<i4')


def pair_record(source: np.ndarray, target: np.ndarray) -> bytes:
  return np.concatenate([[len(source)], source, target]).astype(_INT32).tobytes()


def write_pairs(path: pathlib.Path, pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> int:
  """Writes ``pairs`` (source, target) to ``path`` atomically; returns the number written."""
  from array_record.python.array_record_module import ArrayRecordWriter

  tmp = path.with_name(f'{path.name}.tmp.{os.getpid()}')
  writer = ArrayRecordWriter(str(tmp), 'group_size:1,uncompressed')
  count = 0
  try:
    for source, target in pairs:
      writer.write(pair_record(source, target))
      count += 1
  finally:
    writer.close()
  tmp.replace(path)
  return count


class RecordSet:
  """One named set of one pair read from its array_record file; the interface of ``translation.EncodedSet``
  that training needs (``len``, ``source(i)``, ``target(i)``, ``fitting(max_len)``)."""

  def __init__(self, pair: str, name: str, path: pathlib.Path):
    from array_record.python.array_record_module import ArrayRecordReader

    self.pair, self.name, self.path = pair, name, pathlib.Path(path)
    self._reader = ArrayRecordReader(str(path))
    self._last: tuple[int, np.ndarray] = (-1, np.zeros(0, _INT32))
    n = self._reader.num_records()
    self.source_lengths = np.zeros(n, np.int32)
    self.target_lengths = np.zeros(n, np.int32)
    for start in range(0, n, 65536):  # Lengths read in slices: memory ~ one slice of records.
      for i, record in enumerate(self._reader.read(list(range(start, min(start + 65536, n)))), start):
        row = np.frombuffer(record, _INT32)
        self.source_lengths[i], self.target_lengths[i] = row[0], len(row) - 1 - row[0]

  def __len__(self) -> int:
    return len(self.source_lengths)

  def _row(self, i: int) -> np.ndarray:
    if self._last[0] != i:  # make_rows asks for source(i) then target(i): one read.
      self._last = (i, np.frombuffer(self._reader.read([int(i)])[0], _INT32))
    return self._last[1]

  def source(self, i: int) -> np.ndarray:
    row = self._row(i)
    return row[1:1 + row[0]]

  def target(self, i: int) -> np.ndarray:
    row = self._row(i)
    return row[1 + row[0]:]

  def fitting(self, max_len: int) -> np.ndarray:
    from stablemoe_jax.data.translation import fitting_pairs
    return fitting_pairs(self.source_lengths, self.target_lengths, max_len)

  def __getstate__(self):
    return {'pair': self.pair, 'name': self.name, 'path': str(self.path)}

  def __setstate__(self, state):
    self.__init__(state['pair'], state['name'], pathlib.Path(state['path']))

"""A split as one token stream: the concatenation of its line records.

`TokenStream` sees a sequence of 1-D int32 records (each line's ids + eos)
as one stream of `len(stream)` tokens, and reads any range `[start, stop)` of
it through a cumulative-offsets array computed once from the record lengths:

    offsets: int64 [num_records + 1], offsets[0] = 0, offsets[-1] = len(stream)
    record r covers stream positions [offsets[r], offsets[r + 1])

The records stay behind a random-access source (e.g. a TFDS array_record data
source); with `in_memory=True` (the default below `IN_MEMORY_MAX_TOKENS`) the
stream is also kept as one flat numpy array so reads are a slice.

Reading a TFDS split record by record parses every record's tf.Example (PTB's
49,199 lines: ~4 s, paid again by every run, resumption and evaluation), so
`cached_records` saves an in-memory split once as its flat ids and offsets
(`SPLIT.stream.npz` beside the records) and later runs load that instead.
"""

from __future__ import annotations

import os
import pathlib
import socket
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

IN_MEMORY_MAX_TOKENS = 1 << 28  # 1 GiB of int32.
_READ_CHUNK = 4096


class RecordSource(Protocol):
  """Random access to records; `__getitems__` (batched) is optional."""

  def __len__(self) -> int: ...

  def __getitem__(self, index: int) -> Any: ...


class FieldSource:
  """View of a source of dict records as a source of one field's arrays."""

  def __init__(self, source: RecordSource, field: str = 'tokens'):
    self._source = source
    self._field = field

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> np.ndarray:
    return self._source[index][self._field]

  def __getitems__(self, indices: Sequence[int]) -> list[np.ndarray]:
    getitems = getattr(self._source, '__getitems__', None)
    records = getitems(list(indices)) if getitems else [self._source[i] for i in indices]
    return [r[self._field] for r in records]


def _read_records(source: RecordSource, start: int, stop: int) -> list[np.ndarray]:
  if stop <= start:
    return []
  getitems = getattr(source, '__getitems__', None)
  if getitems is not None:
    return list(getitems(list(range(start, stop))))
  return [source[i] for i in range(start, stop)]


class FlatRecords:
  """Records held as one flat int32 array cut at ``offsets`` (int64 [num_records + 1]); a `RecordSource`."""

  def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
    if offsets.ndim != 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or np.any(np.diff(offsets) < 0):
      raise ValueError(f'offsets must rise from 0 to len(tokens)={len(tokens)}')
    self.tokens, self.offsets = tokens, offsets

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def __getitem__(self, index: int) -> np.ndarray:
    return self.tokens[self.offsets[index]:self.offsets[index + 1]]

  def __getitems__(self, indices: Sequence[int]) -> list[np.ndarray]:
    return [self[i] for i in indices]


def cached_records(records: RecordSource, cache: pathlib.Path) -> RecordSource:
  """``records`` as `FlatRecords` loaded from ``cache`` (an .npz of ``tokens`` and ``offsets``), written first
  from ``records`` if missing. The cache must belong to these records (e.g. live in their TFDS folder, whose name
  carries the tokenizer's fingerprint). A split too large for memory, or a folder this process cannot write, gets
  ``records`` back unchanged."""
  cache = pathlib.Path(cache)
  if cache.is_file():
    with np.load(cache) as saved:
      return FlatRecords(saved['tokens'].astype(np.int32, copy=False), saved['offsets'].astype(np.int64, copy=False))
  stream = TokenStream(records)
  if not stream.in_memory:
    return records
  flat = FlatRecords(stream.read(0, len(stream)), stream.offsets)
  # Concurrent writers (processes, hosts sharing a file system) each rename a complete file of their own.
  tmp = cache.with_name(f'{cache.name}.{socket.gethostname()}.{os.getpid()}.tmp')
  try:
    with open(tmp, 'wb') as f:
      np.savez(f, tokens=flat.tokens, offsets=flat.offsets)
    tmp.replace(cache)
  except OSError:
    tmp.unlink(missing_ok=True)
  return flat


class TokenStream:
  """The concatenation of a split's records, readable by range."""

  def __init__(self, records: RecordSource, in_memory: bool | None = None):
    """Reads every record once to get its length (and, if in memory, its ids).

    Args:
      records: `records[r]` is record r's 1-D integer token array.
      in_memory: keep the whole stream as one int32 array; None = only if it
        has at most IN_MEMORY_MAX_TOKENS tokens.
    """
    self._records = records
    if isinstance(records, FlatRecords) and in_memory is not False:
      self.offsets, self._flat = records.offsets, records.tokens
      self._flat.flags.writeable = False
      return
    num_records = len(records)
    lengths = np.empty(num_records, dtype=np.int64)
    chunks: list[np.ndarray] = []
    keep = in_memory is not False
    total = 0
    for start in range(0, num_records, _READ_CHUNK):
      stop = min(start + _READ_CHUNK, num_records)
      arrays = _read_records(records, start, stop)
      lengths[start:stop] = [len(a) for a in arrays]
      total += int(lengths[start:stop].sum())
      if keep and in_memory is None and total > IN_MEMORY_MAX_TOKENS:
        keep, chunks = False, []
      if keep:
        chunks.extend(np.asarray(a, dtype=np.int32) for a in arrays)
    self.offsets = np.zeros(num_records + 1, dtype=np.int64)
    np.cumsum(lengths, out=self.offsets[1:])
    self._flat: np.ndarray | None = None
    if keep:
      self._flat = np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
      self._flat.flags.writeable = False  # `read` returns views of it.

  @property
  def num_records(self) -> int:
    return len(self.offsets) - 1

  @property
  def in_memory(self) -> bool:
    return self._flat is not None

  def __len__(self) -> int:
    """Number of tokens in the stream (every record's ids + eos)."""
    return int(self.offsets[-1])

  def record_lengths(self) -> np.ndarray:
    """int64 [num_records]."""
    return np.diff(self.offsets)

  def read(self, start: int, stop: int) -> np.ndarray:
    """int32 [stop - start]: stream positions [start, stop), 0 <= start <= stop <= len.

    May be a read-only view; copy before writing into it.
    """
    if not 0 <= start <= stop <= len(self):
      raise IndexError(f'range [{start}, {stop}) outside a stream of {len(self)} tokens')
    if self._flat is not None:
      return self._flat[start:stop]
    if start == stop:
      return np.zeros(0, np.int32)
    # First record containing `start`, last record containing `stop - 1`.
    first = int(np.searchsorted(self.offsets, start, side='right')) - 1
    last = int(np.searchsorted(self.offsets, stop, side='left')) - 1
    arrays = _read_records(self._records, first, last + 1)
    joined = np.concatenate([np.asarray(a, dtype=np.int32) for a in arrays])
    base = int(self.offsets[first])
    return joined[start - base : stop - base]

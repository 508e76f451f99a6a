"""Raw text inputs cut into shards, and the lines of one shard.

A split's inputs are comma-separated globs (each expanded and sorted; a file
named twice counts once). The split's stream order is: files in that order,
each file's lines in file order. A file becomes shards:

* plain text: byte ranges [start, stop) of `shard_bytes`. A line belongs to
  the shard holding its first byte, so the shards partition the lines
  whatever the cut points, and a worker reads only its range (`seek`).
* `.gz` / `.zst`: the whole file is one shard (a compressed stream cannot be
  entered in the middle). Split such a corpus into several files.

Lines follow `text.iter_lines`: UTF-8, a leading BOM dropped, CR / CRLF / LF
line ends, surrounding whitespace stripped, empty lines skipped; the lines of
a PTB file read here equal `text.iter_lines` of it.

A shard's name carries a fingerprint of the preparation settings, the input
file's identity (path, size, mtime, md5 of its first MiB) and the byte range,
so a changed input or setting gives new names and never reuses stale output.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import io
import os
import pathlib
from collections.abc import Iterator

from stablemoe_jax.data.common import text
from stablemoe_jax.data.common.locate import DataError

COMPRESSED = ('.gz', '.zst')
_HEAD_BYTES = 1 << 20


class EmptyInputError(DataError):
  """A glob matches no file, or a split has no input."""


class MisalignedError(DataError):
  """The source and target files of a parallel set have different line counts."""


@dataclasses.dataclass(frozen=True)
class ShardSpec:
  """One unit of work: the lines of `path` whose first byte lies in [start, stop).

  `stop == -1` means to the end of the file (compressed files). `index` is the
  shard's position in its split's stream order; `name` is its output stem.
  """

  split: str
  index: int
  path: str
  start: int
  stop: int
  name: str
  # Translation (`plan_aligned`): the target file's byte range holding the same lines as [start, stop).
  target_path: str = ''
  target_start: int = 0
  target_stop: int = 0
  language: str = ''  # the source language, whose tag starts every source

  @property
  def num_bytes(self) -> int:
    """Bytes of input the shard covers (a compressed file: its size on disk)."""
    return (os.path.getsize(self.path) if self.stop < 0 else self.stop) - self.start


def expand_inputs(patterns: str, what: str) -> list[pathlib.Path]:
  """The files of comma-separated globs, each glob sorted, in order, without repeats.

  Raises:
    EmptyInputError: nothing given, or a glob matches no file (one line naming it).
  """
  files: dict[str, None] = {}
  globs = [p.strip() for p in str(patterns).split(',') if p.strip()]
  if not globs:
    raise EmptyInputError(f'{what}: no input given; set it to a file or glob of plain-text files.')
  for pattern in globs:
    matched = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    if not matched:
      raise EmptyInputError(f'{what}: {pattern!r} matches no file.')
    files.update(dict.fromkeys(os.path.abspath(p) for p in matched))
  return [pathlib.Path(p) for p in files]


def file_stat(path: os.PathLike | str) -> str:
  """'path:size:mtime' of an input file (no read)."""
  stat = os.stat(path)
  return f'{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}'


def file_identity(path: os.PathLike | str) -> str:
  """Cheap identity of an input file: `file_stat` and the md5 of its first MiB."""
  with open(path, 'rb') as f:
    head = hashlib.md5(f.read(_HEAD_BYTES)).hexdigest()
  return f'{file_stat(path)}:{head}'


def plan_split(split: str, files: list[pathlib.Path], shard_bytes: int, settings: str) -> list[ShardSpec]:
  """The shards of one split, in stream order (`settings`: fingerprint of everything else)."""
  if shard_bytes < 1:
    raise ValueError(f'shard_bytes must be positive, got {shard_bytes}.')
  specs: list[ShardSpec] = []
  for path in files:
    identity = file_identity(path)
    if path.name.endswith(COMPRESSED):
      ranges = [(0, -1)]
    else:
      size = path.stat().st_size
      ranges = [(start, min(start + shard_bytes, size)) for start in range(0, size, shard_bytes)] or [(0, 0)]
    for start, stop in ranges:
      digest = hashlib.sha256(f'{settings};{identity};{start}:{stop}'.encode()).hexdigest()[:12]
      index = len(specs)
      specs.append(ShardSpec(split, index, str(path), start, stop, f'{split}-{index:05d}-{digest}'))
  return specs


def _open_binary(path: str) -> io.BufferedIOBase:
  if path.endswith('.gz'):
    return gzip.open(path, 'rb')
  if path.endswith('.zst'):
    import zstandard  # Only for .zst inputs (installed with apache-beam).
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, 'rb'), closefd=True))
  return open(path, 'rb')


def _line_number(path: str, start: int, lines_in_shard: int) -> int:
  """1-based number in the file of the shard's `lines_in_shard`-th raw line (only on errors)."""
  # The shard's first line begins after the first newline at or after byte start - 1.
  before = 1 if start > 0 else 0
  with open(path, 'rb') as f:
    remaining = max(start - 1, 0)
    while remaining > 0:
      block = f.read(min(remaining, 1 << 24))
      if not block:
        break
      before += block.count(b'\n')
      remaining -= len(block)
  return before + lines_in_shard


def iter_raw_lines(spec: ShardSpec) -> Iterator[bytes]:
  """The raw lines (ending bytes kept) whose first byte lies in the shard's range."""
  with _open_binary(spec.path) as f:
    if spec.stop < 0:
      yield from f
      return
    pos = spec.start
    if pos > 0:
      f.seek(pos - 1)
      pos += len(f.readline()) - 1  # Finish the line that began before `start`.
    while pos < spec.stop:
      raw = f.readline()
      if not raw:
        return
      pos += len(raw)
      yield raw


def iter_line_batches(spec: ShardSpec, batch_lines: int) -> Iterator[list[str]]:
  """The shard's non-empty, stripped lines in lists of at most `batch_lines`.

  Raises:
    text.BadCorpusError: a line is not UTF-8 (names file, line and byte) or
      the file cannot be read.
  """
  batch: list[str] = []
  number = 0
  try:
    for number, raw in enumerate(iter_raw_lines(spec), start=1):
      if number == 1 and spec.start == 0 and raw.startswith(text.BOM):
        raw = raw[len(text.BOM):]
      try:
        decoded = raw.decode('utf-8')
      except UnicodeDecodeError as error:
        line = number if spec.stop < 0 else _line_number(spec.path, spec.start, number)
        raise text.BadCorpusError(
            f'{spec.path}, line {line}: byte 0x{raw[error.start:error.start + 1].hex()} at column '
            f'{error.start + 1} is not UTF-8; convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) '
            f'or pass --skip_bad_files.') from None
      # A lone CR ends a line too, as in universal-newline reading.
      for piece in decoded.split('\r'):
        piece = piece.strip()
        if piece:
          batch.append(piece)
      if len(batch) >= batch_lines:
        yield batch
        batch = []
  except (OSError, EOFError) as error:  # Unreadable, truncated or corrupt (gzip raises OSError) input.
    raise text.BadCorpusError(f'{spec.path}: cannot be read after line {number} ({error}); '
                              f'fix or remove the file, or pass --skip_bad_files.') from None
  if batch:
    yield batch


def iter_lines(specs: list[ShardSpec]) -> Iterator[str]:
  """Every line of `specs` in order (e.g. a split's lines for tokenizer training)."""
  for spec in specs:
    for batch in iter_line_batches(spec, 4096):
      yield from batch


def _line_starts(path: str, every: int) -> tuple[int, list[int]]:
  """(number of '\\n'-ended lines, byte offset of lines every, 2 * every, ...) of a file (one streaming pass)."""
  lines, starts, offset = 0, [], 0
  with _open_binary(path) as f:
    for raw in f:
      lines += 1
      offset += len(raw)
      if lines % every == 0:
        starts.append(offset)
  return lines, starts


def plan_aligned(split: str, source: pathlib.Path, target: pathlib.Path, shard_lines: int, settings: str,
                 language: str = '') -> list[ShardSpec]:
  """Shards of a line-aligned parallel file pair: the same line ranges of both files, `shard_lines` a shard.

  Lines here are '\\n'-ended (empty lines kept: they hold a place). A compressed file pair is one shard.

  Raises:
    MisalignedError: the two files have different line counts (names both).
  """
  if shard_lines < 1:
    raise ValueError(f'shard_lines must be positive, got {shard_lines}.')
  (n_source, source_starts), (n_target, target_starts) = (_line_starts(str(p), shard_lines) for p in (source, target))
  if n_source != n_target:
    raise MisalignedError(f'{source} has {n_source} lines but {target} has {n_target}; the source and target '
                          f'files of a pair must be line-aligned (one sentence pair a line).')
  identity = f'{file_identity(source)};{file_identity(target)}'
  if str(source).endswith(COMPRESSED) or str(target).endswith(COMPRESSED):
    bounds = [((0, -1), (0, -1))]
  else:
    cuts = lambda starts, path: [0] + starts[:-1 if n_source % shard_lines == 0 else None] + [path.stat().st_size]
    s_cuts, t_cuts = cuts(source_starts, source), cuts(target_starts, target)
    bounds = list(zip(zip(s_cuts, s_cuts[1:]), zip(t_cuts, t_cuts[1:])))
  specs = []
  for index, ((start, stop), (t_start, t_stop)) in enumerate(bounds):
    digest = hashlib.sha256(f'{settings};{identity};{start}:{stop};{t_start}:{t_stop}'.encode()).hexdigest()[:12]
    specs.append(ShardSpec(split, index, str(source), start, stop, f'{split}-{index:05d}-{digest}',
                           str(target), t_start, t_stop, language))
  return specs


def iter_aligned_pairs(spec: ShardSpec) -> Iterator[tuple[str, str]]:
  """(source, target) lines of an aligned shard, stripped, empty ones kept, a leading BOM dropped.

  Raises:
    text.BadCorpusError: a line is not UTF-8 (names the file and line).
  """
  target = dataclasses.replace(spec, path=spec.target_path, start=spec.target_start, stop=spec.target_stop)
  for number, raws in enumerate(zip(iter_raw_lines(spec), iter_raw_lines(target)), start=1):
    lines = []
    for side, raw in zip((spec, target), raws):
      if number == 1 and side.start == 0 and raw.startswith(text.BOM):
        raw = raw[len(text.BOM):]
      try:
        lines.append(raw.decode('utf-8').strip())
      except UnicodeDecodeError:
        line = number if side.stop < 0 else _line_number(side.path, side.start, number)
        raise text.BadCorpusError(f'{side.path}, line {line}: not UTF-8; convert the file to UTF-8 or pass '
                                  f'--skip_bad_files.') from None
    yield lines[0], lines[1]

"""Reading plain-text corpora: one sentence (or segment) per line.

Every consumer of raw text (tokenizer training, the TFDS builder, tests) reads
lines through `iter_lines`, so they all agree on what a "line" is:

* UTF-8, a leading byte-order mark is dropped (botchan.txt has one);
* CRLF / CR line endings are normalised (universal newlines);
* the line ending and surrounding whitespace are stripped;
* empty (whitespace-only) lines are skipped.

`check_corpus_file` is run on every raw split file before anything is
prepared from it: bad bytes or a split without text are one `BadCorpusError`
naming the file (and line), so nothing is written from a corpus that cannot be
used.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from stablemoe_jax.data.common.locate import DataError

BOM = b'\xef\xbb\xbf'


class BadCorpusError(DataError):
  """A raw corpus file is not UTF-8 or has no text."""


def check_corpus_file(path: os.PathLike | str, split: str) -> None:
  """Raises BadCorpusError unless `path` is UTF-8 text with at least one non-empty line."""
  has_text = False
  with open(path, 'rb') as f:
    for number, raw in enumerate(f, start=1):
      if number == 1 and raw.startswith(BOM):
        raw = raw[len(BOM):]
      try:
        line = raw.decode('utf-8')
      except UnicodeDecodeError as error:
        bad = raw[error.start:error.start + 1]
        raise BadCorpusError(
            f'{path}, line {number}: byte 0x{bad.hex()} at column {error.start + 1} is not UTF-8; the corpus files '
            f'must be UTF-8 text. Convert the file, e.g. `iconv -f latin1 -t utf-8 {path} > {path}.utf8` '
            f'(replace latin1 with its real encoding), and rename it.') from None
      has_text = has_text or bool(line.strip())
  if not has_text:
    raise BadCorpusError(
        f'{path}: the {split} split is empty (no line with text); put one sentence or segment per line in it.')


def iter_lines(path: os.PathLike | str) -> Iterator[str]:
  """Yields the non-empty lines of a UTF-8 text file, stripped."""
  with open(path, encoding='utf-8-sig', newline=None) as f:
    for line in f:
      line = line.strip()
      if line:
        yield line


def file_md5(path: os.PathLike | str, chunk_size: int = 1 << 20) -> str:
  """Hex md5 of a file's bytes."""
  digest = hashlib.md5()
  with open(path, 'rb') as f:
    while chunk := f.read(chunk_size):
      digest.update(chunk)
  return digest.hexdigest()

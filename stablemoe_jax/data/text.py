"""Reading plain-text corpora: one sentence (or segment) per line.

Every consumer of raw text (tokenizer training, the TFDS builder, tests) reads
lines through `iter_lines`, so they all agree on what a "line" is:

* UTF-8, a leading byte-order mark is dropped (botchan.txt has one);
* CRLF / CR line endings are normalised (universal newlines);
* the line ending and surrounding whitespace are stripped;
* empty (whitespace-only) lines are skipped.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator


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

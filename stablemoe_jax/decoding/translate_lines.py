"""Text in, text out: lines of one source language -> detokenised English, batched by length, order kept."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import tqdm

from stablemoe_jax.data.translation.joint_tokenizer import EOS_ID, JointSentencePiece
from stablemoe_jax.models.seq2seq import PAD_ID

# Source batches are padded to a multiple of this many positions: a few shapes (compiles), little padding.
LENGTH_BUCKET = 16


@dataclasses.dataclass
class Translations:
  """One output line per input line, in order, and what it took."""

  lines: list[str]
  truncated: int  # sources longer than the maximum length, translated from their truncated start
  seconds: float  # decoding time, compile included

  @property
  def sentences_per_second(self) -> float:
    return len(self.lines) / max(self.seconds, 1e-9)


def encode_sources(tokenizer: JointSentencePiece, language: str, lines: Sequence[str], max_len: int
                   ) -> tuple[list[np.ndarray], int]:
  """``[tag] + ids + [eos]`` of each line, truncated to ``max_len`` (still ending in eos); and how many were."""
  tag = tokenizer.tag_id(language)
  sources, truncated = [], 0
  for line in lines:
    ids = [tag] + tokenizer.encode(line)
    if len(ids) + 1 > max_len:
      ids, truncated = ids[:max_len - 1], truncated + 1
    sources.append(np.asarray(ids + [EOS_ID], np.int32))
  return sources, truncated


def translate_lines(translate_fn, params, tokenizer: JointSentencePiece, language: str, lines: Sequence[str],
                    batch_size: int, max_len: int, progress: bool = False, length_bucket: int = LENGTH_BUCKET
                    ) -> Translations:
  """Translates every line; an empty (or blank) line gives an empty line without being decoded.

  Sentences are sorted by source length and decoded in batches of [batch_size, S], S the batch's longest
  source rounded up to a multiple of ``length_bucket`` (at most ``max_len``; so at most max_len / length_bucket
  shapes to compile); the last batch is filled with empty rows. The outputs are returned in the input order.
  """
  start = time.time()
  outputs = [""] * len(lines)
  todo = [i for i, line in enumerate(lines) if line.strip()]
  sources, truncated = encode_sources(tokenizer, language, [lines[i] for i in todo], max_len)
  order = sorted(range(len(todo)), key=lambda k: len(sources[k]))
  bar = tqdm.tqdm(total=len(lines), desc="translate", unit="sent", disable=not progress, dynamic_ncols=True)
  bar.update(len(lines) - len(todo))
  for first in range(0, len(order), batch_size):
    chunk = order[first:first + batch_size]
    longest = max(len(sources[k]) for k in chunk)
    batch = np.full((batch_size, min(max_len, -(-longest // length_bucket) * length_bucket)), PAD_ID, np.int32)
    for row, k in enumerate(chunk):
      batch[row, :len(sources[k])] = sources[k]
    tokens, _ = translate_fn(params, batch)
    tokens = np.asarray(tokens)
    for row, k in enumerate(chunk):
      ids = tokens[row]
      end = np.flatnonzero(ids == EOS_ID)
      outputs[todo[k]] = tokenizer.decode(ids[:end[0]] if len(end) else ids)
    bar.update(len(chunk))
  bar.close()
  return Translations(outputs, truncated, time.time() - start)

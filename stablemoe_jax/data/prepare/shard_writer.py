"""One shard's work: read its lines, tokenize them, write an array_record file.

Output of shard `NAME` of split `SPLIT` under `out_dir`:

    SPLIT/NAME.array_record   records = the shard's token stream (every line's
                              ids, then eos) cut into chunks of `chunk_tokens`
                              tokens, the last one shorter; each record is the
                              chunk's raw little-endian bytes of `token_dtype`
                              (uint16 for vocabularies up to 65,536, else int32);
                              written with group_size:1 for random access.
    A translation shard (`ShardJob.task == 'translation'`, an aligned `ShardSpec`):
                              one record per sentence pair, in line order, the
                              layout of `pair_records` (int32 [len(source),
                              *source, *target], source = tag + ids + eos).
    SPLIT/NAME.json           {num_tokens, num_lines, num_records, max_lines_held, seconds}
                              written last: the shard is done iff this exists.
    SPLIT/NAME.bad.json       {error}: the shard met a bad line (no records kept).

The array_record file is written under `NAME.array_record.tmp.PID` and renamed
into place, so a killed worker leaves no half file under the final name.
Memory: one batch of `batch_lines` lines and one chunk, whatever the shard's
size (`max_lines_held` reports the largest batch held).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import time

import numpy as np

from stablemoe_jax.data.common import shards
from stablemoe_jax.data.common import text
from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.translation import joint_tokenizer
from stablemoe_jax.data.translation import pair_records

_TOKENIZERS: dict[str, tokenizers.Tokenizer] = {}


@dataclasses.dataclass(frozen=True)
class ShardJob:
  """What every shard of one preparation shares (picklable, sent to Beam workers)."""

  out_dir: str
  tokenizer_dir: str
  tokenizer_fingerprint: str
  chunk_tokens: int = 4096
  token_dtype: str = 'uint16'
  batch_lines: int = 8192
  task: str = 'lm'  # 'translation': aligned pair shards, the joint sentencepiece model in tokenizer_dir


def token_dtype(vocab_size: int) -> str:
  return 'uint16' if vocab_size <= 1 << 16 else 'int32'


def done_path(out_dir: str | os.PathLike, spec: shards.ShardSpec) -> pathlib.Path:
  return pathlib.Path(out_dir) / spec.split / f'{spec.name}.json'


def bad_path(out_dir: str | os.PathLike, spec: shards.ShardSpec) -> pathlib.Path:
  return pathlib.Path(out_dir) / spec.split / f'{spec.name}.bad.json'


def records_path(out_dir: str | os.PathLike, spec: shards.ShardSpec) -> pathlib.Path:
  return pathlib.Path(out_dir) / spec.split / f'{spec.name}.array_record'


def _tokenizer(job: ShardJob) -> tokenizers.Tokenizer:
  """The job's tokenizer, loaded once per worker process."""
  tokenizer = _TOKENIZERS.get(job.tokenizer_dir)
  if tokenizer is None or tokenizer.fingerprint() != job.tokenizer_fingerprint:
    if job.task == 'translation':
      model = pathlib.Path(job.tokenizer_dir) / joint_tokenizer.MODEL_FILE
      tokenizer = joint_tokenizer.JointSentencePiece(model.read_bytes())
    else:
      tokenizer = tokenizers.load_tokenizer(job.tokenizer_dir)
    if tokenizer.fingerprint() != job.tokenizer_fingerprint:
      raise RuntimeError(f'The tokenizer in {job.tokenizer_dir} changed during the preparation.')
    _TOKENIZERS[job.tokenizer_dir] = tokenizer
  return tokenizer


def encode_lines(tokenizer: tokenizers.Tokenizer, lines: list[str], dtype: str) -> np.ndarray:
  """[sum(len(ids) + 1)]: each line's ids then eos, concatenated."""
  if isinstance(tokenizer, tokenizers.SentencePieceTokenizer):
    ids = tokenizer._sp.encode(lines)  # Batch call: one C++ call for the whole list.
  else:
    ids = [tokenizer.encode(line) for line in lines]
  eos = (tokenizer.eos_id,)
  total = sum(map(len, ids)) + len(ids)
  return np.fromiter(itertools.chain.from_iterable(itertools.chain(x, eos) for x in ids), dtype=dtype, count=total)


def _atomic_json(path: pathlib.Path, value: dict) -> None:
  tmp = path.with_name(f'{path.name}.tmp.{os.getpid()}')
  tmp.write_text(json.dumps(value, sort_keys=True) + '\n')
  tmp.replace(path)


def _write_records(spec: shards.ShardSpec, job: ShardJob, tmp: pathlib.Path) -> dict:
  from array_record.python.array_record_module import ArrayRecordWriter

  tokenizer = _tokenizer(job)
  dtype = np.dtype(job.token_dtype).newbyteorder('<')
  writer = ArrayRecordWriter(str(tmp), 'group_size:1,uncompressed')
  stats = {'num_tokens': 0, 'num_lines': 0, 'num_records': 0, 'max_lines_held': 0}
  pending = np.zeros(0, dtype)
  try:
    for lines in shards.iter_line_batches(spec, job.batch_lines):
      stats['num_lines'] += len(lines)
      stats['max_lines_held'] = max(stats['max_lines_held'], len(lines))
      pending = np.concatenate([pending, encode_lines(tokenizer, lines, dtype)])
      del lines
      full = len(pending) // job.chunk_tokens * job.chunk_tokens
      for start in range(0, full, job.chunk_tokens):
        writer.write(pending[start:start + job.chunk_tokens].tobytes())
      stats['num_tokens'] += full
      stats['num_records'] += full // job.chunk_tokens
      pending = pending[full:]
    if len(pending):
      writer.write(pending.tobytes())
      stats['num_tokens'] += len(pending)
      stats['num_records'] += 1
  finally:
    writer.close()
  return stats


def _write_pair_records(spec: shards.ShardSpec, job: ShardJob, tmp: pathlib.Path) -> dict:
  tokenizer = _tokenizer(job)
  tag, eos = tokenizer.tag_id(spec.language), tokenizer.eos_id
  stats = {'num_tokens': 0, 'num_lines': 0, 'num_records': 0, 'max_lines_held': 0}

  def records():
    pairs = shards.iter_aligned_pairs(spec)
    while batch := list(itertools.islice(pairs, job.batch_lines)):
      stats['max_lines_held'] = max(stats['max_lines_held'], len(batch))
      sources, targets = (tokenizer._sp.encode(list(side)) for side in zip(*batch))  # One C++ call a side.
      for source, target in zip(sources, targets):
        stats['num_tokens'] += len(source) + 2 + len(target)
        yield np.asarray([tag, *source, eos]), np.asarray(target)

  stats['num_records'] = stats['num_lines'] = pair_records.write_pairs(tmp, records(), rename=False)
  return stats


def process_shard(spec: shards.ShardSpec, job: ShardJob) -> str:
  """Writes one shard unless it is done; returns 'existing', 'written' or 'bad'."""
  done = done_path(job.out_dir, spec)
  if done.exists():
    return 'existing'
  final = records_path(job.out_dir, spec)
  final.parent.mkdir(parents=True, exist_ok=True)
  tmp = final.with_name(f'{final.name}.tmp.{os.getpid()}')
  started = time.perf_counter()
  try:
    stats = (_write_pair_records if job.task == 'translation' else _write_records)(spec, job, tmp)
  except text.BadCorpusError as error:
    tmp.unlink(missing_ok=True)
    _atomic_json(bad_path(job.out_dir, spec), {'error': str(error), 'path': spec.path})
    return 'bad'
  tmp.replace(final)
  _atomic_json(done, dict(stats, seconds=round(time.perf_counter() - started, 3)))
  return 'written'

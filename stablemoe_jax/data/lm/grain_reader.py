"""Reading the shards written by `prepare` as token streams for the grain pipeline.

A split is the concatenation, in shard order, of its shards' records (chunks
of the token stream, see `shard_writer`), so it is the same stream as the one
`builder` + `stream.TokenStream` give for the same lines and tokenizer. The
training and evaluation pipelines of `pipeline` run on it unchanged:

    ArrayRecordDataSource(all shards of the split)       (random access, global keys)
      -> ShardedStream.read(start, stop)                  (records covering the range)
      -> blocks.TrainBlocks -> grain shuffle / repeat / batch / [process::count]

so on PTB the batches equal today's (`tests/data/lm/test_prepare_reader.py`), and the
iterator state is the same `{'next_index': k}` the train loop checkpoints.
Record lengths come from the manifest, so opening a split reads no record.
Splits up to `stream.IN_MEMORY_MAX_TOKENS` tokens are read once into memory.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence

import numpy as np

from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.common import locate, shards, tokenizers
from stablemoe_jax.data.lm import batches as pipeline
from stablemoe_jax.data.lm import eval_sets
from stablemoe_jax.data.lm import prepared
from stablemoe_jax.data.lm import stream as stream_lib

_FEW = 64  # Up to this many records are read one by one (see ChunkRecords.__getitems__).


class ChunkRecords:
  """The records of array_record shards as 1-D token arrays (random access)."""

  def __init__(self, paths: Sequence[str], dtype: str):
    from array_record.python.array_record_data_source import ArrayRecordDataSource
    self._paths = list(paths)
    self._dtype = np.dtype(dtype).newbyteorder('<')
    self._source = ArrayRecordDataSource(self._paths) if self._paths else []

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> np.ndarray:
    return np.frombuffer(self._source[index], self._dtype)

  def __getitems__(self, indices: Sequence[int]) -> list[np.ndarray]:
    if len(indices) <= _FEW:  # array_record's batched read costs ~1 ms of thread-pool set-up per call.
      return [self[i] for i in indices]
    return [np.frombuffer(r, self._dtype) for r in self._source.__getitems__(list(indices))]


class ShardedStream(stream_lib.TokenStream):
  """A split's shards as one `TokenStream`, with offsets from the shards' token counts."""

  def __init__(self, paths: Sequence[str], num_tokens: Sequence[int], chunk_tokens: int, dtype: str,
               in_memory: bool | None = None):
    kept = [(p, int(n)) for p, n in zip(paths, num_tokens) if n > 0]
    self._records = ChunkRecords([p for p, _ in kept], dtype)
    lengths = []
    for _, n in kept:
      lengths += [chunk_tokens] * (n // chunk_tokens) + ([n % chunk_tokens] if n % chunk_tokens else [])
    if len(lengths) != len(self._records):
      raise ValueError(f'The shards hold {len(self._records)} records, their manifest says {len(lengths)}.')
    self.offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=self.offsets[1:])
    self._flat = None
    if in_memory or (in_memory is None and len(self) <= stream_lib.IN_MEMORY_MAX_TOKENS):
      self._flat = self.read(0, len(self)).copy()
      self._flat.flags.writeable = False


@dataclasses.dataclass
class ShardedLMData(pipeline.LMData):
  """`LMData` whose splits are `ShardedStream`s.

  Its train iterator keeps `pipeline.DEFAULT_READ_OPTIONS` (2 read threads, 8 batches ahead). Measured on 2
  shared cores (benchmarks/input_pipeline.py, 64 x 1024 batches of a 1.05B-token split read from disk): 0
  threads 7.8M tokens/s, 2 threads 14.2M, grain's default 16 threads 14.6M, 1 or 2 worker processes
  (`mp_prefetch`) 8.8M / 10.0M; 2 threads is as fast as 16 without 16 threads' contention on few cores.
  """

  streams: dict[str, ShardedStream] = dataclasses.field(default_factory=dict, repr=False)

  def __post_init__(self):
    super().__post_init__()
    self._streams.update(self.streams)


def open_splits(root: pathlib.Path, manifest: dict, in_memory: bool | None = None) -> dict[str, ShardedStream]:
  """{split: ShardedStream} of a `prepare` manifest whose shard paths are relative to `root`."""
  return {split: ShardedStream([str(root / s['file']) for s in shard_list], [s['num_tokens'] for s in shard_list],
                               manifest['chunk_tokens'], manifest['token_dtype'], in_memory)
          for split, shard_list in manifest['shards'].items()}


def load(prepared_dir: pathlib.Path, data: LMDataSettings, in_memory: bool | None = None) -> ShardedLMData:
  """The data `prepare` wrote into `prepared_dir`, after checking they fit the run's `data` settings.

  `in_memory`: read the splits into memory (None: those up to `stream.IN_MEMORY_MAX_TOKENS` tokens).

  Raises:
    PreparedDataMismatchError: prepared with other data settings, with another
      tokenizer, or from inputs that have changed since (when they are here).
  """

  manifest = json.loads((prepared_dir / prepared.MANIFEST).read_text())
  fix = (f'Run `python -m stablemoe_jax.prepare` again with this config and --workdir, '
         f'or use a new --workdir.')
  wanted = prepared.settings(data)
  differ = [f'data.{k}={v!r} but they were prepared with {manifest.get(k)!r}'
            for k, v in wanted.items() if manifest.get(k) != v]
  if differ:
    raise prepared.PreparedDataMismatchError(
        f'The shards prepared in {prepared_dir} do not match this config: {"; ".join(differ)}. {fix}')
  unprepared = [split for split in eval_sets.set_globs(data) if split not in manifest['shards']]
  if unprepared:
    raise prepared.PreparedDataMismatchError(
        f'data.eval_sets names split(s) {", ".join(unprepared)} that the shards in {prepared_dir} were not prepared '
        f'with (prepared: {", ".join(manifest["shards"])}). Run `python -m stablemoe_jax.prepare` again with '
        f'this data.eval_sets and --workdir, or use a new --workdir.')
  try:  # Only stat() here: a run's start must not read the inputs (prepare's names also hash their heads).
    now = {split: [shards.file_stat(p) for p in paths] for split, paths in prepared.split_inputs(data).items()}
  except (locate.DataNotFoundError, shards.EmptyInputError):
    now = None  # No raw corpus here (evaluating or resuming elsewhere): the shards are what there is.
  # The splits this config reads (sets prepared but no longer named are not compared).
  then = {split: [i.rsplit(':', 1)[0] for i in ids] for split, ids in manifest['inputs'].items()
          if now is None or split in now}
  if now is not None and now != then:
    raise prepared.PreparedDataMismatchError(
        f'The input files changed since the shards in {prepared_dir} were prepared. {fix}')
  tokenizer = tokenizers.load_tokenizer(prepared_dir / 'tokenizer')
  if tokenizer.fingerprint() != manifest['tokenizer_fingerprint']:
    raise prepared.PreparedDataMismatchError(
        f'The tokenizer in {prepared_dir / "tokenizer"} is not the one the shards were written with. {fix}')
  streams = open_splits(prepared_dir, manifest, in_memory)
  return ShardedLMData(tokenizer=tokenizer, vocab_size=tokenizer.vocab_size,
                       sources={split: s._records for split, s in streams.items()}, streams=streams)

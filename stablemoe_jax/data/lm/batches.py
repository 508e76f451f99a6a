"""LM batches from a split's token stream: shuffled train blocks and in-order eval rows, as grain datasets.

`LMData` (a prepared corpus: tokenizer + one token stream per split) is what `pipeline.load_lm_data` and
`grain_reader.load` return. Every batch is a dict of numpy arrays: `inputs` int32 [B, S], `targets` int32 [B, S],
`weights` float32 [B, S].
"""
from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterator, Mapping

import grain
import numpy as np

from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.lm import blocks as blocks_lib
from stablemoe_jax.data.lm.stream import RecordSource, TokenStream, cached_records

Batch = dict[str, np.ndarray]

DEFAULT_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


def per_process_batch(batch_size: int, shard_index: int, shard_count: int) -> int:
  if shard_count < 1 or not 0 <= shard_index < shard_count:
    raise ValueError(f'Need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}.')
  if batch_size < 1 or batch_size % shard_count:
    raise ValueError(
        f'batch_size={batch_size} must be a positive multiple of shard_count={shard_count}.'
    )
  return batch_size // shard_count


def train_dataset(
    stream: TokenStream,
    batch_size: int,
    seq_len: int,
    seed: int,
    shard_index: int = 0,
    shard_count: int = 1,
) -> grain.MapDataset:
  """Infinite MapDataset of this process's training batches ([B // shard_count, S] each)."""
  local = per_process_batch(batch_size, shard_index, shard_count)
  ds = grain.MapDataset.source(blocks_lib.TrainBlocks(stream, seq_len))
  ds = ds.seed(seed).shuffle().repeat(None)
  ds = ds.batch(local, drop_remainder=True)
  if shard_count > 1:
    ds = ds[shard_index::shard_count]
  return ds


def train_iterator(
    stream: TokenStream,
    batch_size: int,
    seq_len: int,
    seed: int,
    shard_index: int = 0,
    shard_count: int = 1,
    read_options: grain.ReadOptions | None = None,
) -> grain.DatasetIterator:
  """Endless iterator of training batches with get_state() / set_state()."""
  ds = train_dataset(stream, batch_size, seq_len, seed, shard_index, shard_count)
  return iter(ds.to_iter_dataset(read_options or DEFAULT_READ_OPTIONS))


def eval_batches(
    stream: TokenStream, batch_size: int, seq_len: int, pad_id: int = 0, stride: int = 0
) -> Iterator[Batch]:
  """Batches covering every prediction of the stream once, in order (last one padded).

  ``stride`` 0 or ``seq_len``: non-overlapping rows (`blocks.EvalRows`); ``0 < stride < seq_len``:
  sliding windows (`blocks.SlidingEvalRows`), each prediction scored once with >= seq_len - stride
  tokens of context (the first window's excepted).
  """
  if batch_size < 1:
    raise ValueError(f'batch_size must be positive, got {batch_size}.')
  if 0 < stride < seq_len:
    make_rows = lambda padding: blocks_lib.SlidingEvalRows(stream, seq_len, stride, padding, pad_id)
  else:
    make_rows = lambda padding: blocks_lib.EvalRows(stream, seq_len, num_padded_rows=padding, pad_id=pad_id)
  rows = make_rows(0)
  rows = make_rows(-rows.num_data_rows % batch_size)
  ds = grain.MapDataset.source(rows).batch(batch_size)
  for i in range(len(ds)):
    yield ds[i]


@dataclasses.dataclass
class LMData:
  """A prepared LM corpus: its tokenizer and its splits' token streams.

  Attributes:
    tokenizer: the tokenizer the records were written with.
    vocab_size: == tokenizer.vocab_size.
    sources: {split: random-access source of 1-D int32 records (line ids + eos)}.
    stream_cache_dir: where each split's stream is saved flat on first use and loaded from later
      (`stream.cached_records`; the folder of ``sources``' records), or None: read ``sources`` every time.
  """

  tokenizer: tokenizers.Tokenizer
  vocab_size: int
  sources: Mapping[str, RecordSource] = dataclasses.field(repr=False)
  stream_cache_dir: pathlib.Path | None = None
  _streams: dict[str, TokenStream] = dataclasses.field(default_factory=dict, init=False, repr=False)

  def __post_init__(self):
    if self.vocab_size != self.tokenizer.vocab_size:
      raise ValueError(f'vocab_size {self.vocab_size} != tokenizer.vocab_size {self.tokenizer.vocab_size}')

  def stream(self, split: str) -> TokenStream:
    """The split's token stream (built on first use, then cached)."""
    if split not in self.sources:
      raise ValueError(f'Unknown split {split!r}; available: {", ".join(self.sources)}.')
    if split not in self._streams:
      records = self.sources[split]
      if self.stream_cache_dir is not None:
        records = cached_records(records, self.stream_cache_dir / f'{split}.stream.npz')
      self._streams[split] = TokenStream(records)
    return self._streams[split]

  def split_num_tokens(self, split: str) -> int:
    """Tokens in the split's stream (ids + one eos per line); it has this minus 1 targets."""
    return len(self.stream(split))

  def train_iterator(
      self,
      batch_size: int,
      seq_len: int,
      seed: int,
      shard_index: int = 0,
      shard_count: int = 1,
      read_options: grain.ReadOptions | None = None,
  ) -> grain.DatasetIterator:
    """Endless shuffled batches of the 'train' split, [batch_size // shard_count, seq_len]."""
    return train_iterator(
        self.stream('train'), batch_size, seq_len, seed, shard_index, shard_count, read_options
    )

  def eval_batches(self, split: str, batch_size: int, seq_len: int, stride: int = 0) -> Iterator[Batch]:
    """[batch_size, seq_len] batches covering the split's predictions once, in order (see `eval_batches`)."""
    return eval_batches(self.stream(split), batch_size, seq_len, stride=stride)

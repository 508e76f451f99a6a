"""The token stream and its blocks: in and out of memory, saved flat, train blocks and epochs, exact resume,
process shards, evaluation batches."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stablemoe_jax.data.lm import blocks
from stablemoe_jax.data.lm import pipeline
from stablemoe_jax.data.lm import pipeline as data_lib
from stablemoe_jax.data.lm import stream
from tests.data.conftest import BATCH, SEQ_LEN, _data_settings


# --- token stream and blocks ---------------------------------------------------


def test_stream_matches_text_in_and_out_of_memory(ptb, valid_stream_ref):
  in_mem = ptb.stream('valid')
  assert in_mem.in_memory
  np.testing.assert_array_equal(in_mem.read(0, len(in_mem)), valid_stream_ref)
  lazy = stream.TokenStream(ptb.sources['valid'], in_memory=False)
  assert not lazy.in_memory and len(lazy) == len(valid_stream_ref)
  np.testing.assert_array_equal(lazy.offsets, in_mem.offsets)
  rng = np.random.default_rng(0)
  for _ in range(50):
    start = int(rng.integers(0, len(lazy)))
    stop = min(len(lazy), start + int(rng.integers(0, 200)))
    np.testing.assert_array_equal(lazy.read(start, stop), valid_stream_ref[start:stop])
  np.testing.assert_array_equal(lazy.read(len(lazy) - 5, len(lazy)), valid_stream_ref[-5:])
  with pytest.raises(IndexError):
    lazy.read(0, len(lazy) + 1)


def test_a_split_read_once_is_saved_flat_and_loaded_back_equal(ptb, shared_data, prepared_dir, valid_stream_ref,
                                                                tmp_path):
  """The first `stream` of a split writes SPLIT.stream.npz beside its TFDS records; a later load reads that file
  (no record parsed) and gives the same ids and line offsets as the text. Where the file cannot be written, the
  records read are used as they are."""
  ptb.stream('valid')
  cache = ptb.stream_cache_dir / 'valid.stream.npz'
  assert cache.is_file() and cache.parent == prepared_dir / 'tfds' / 'lm_corpus' / cache.parent.parent.name / '1.0.0'
  again = data_lib.load_lm_data(_data_settings(shared_data), prepared_dir)
  loaded = again.stream('valid')
  assert isinstance(loaded._records, stream.FlatRecords)
  np.testing.assert_array_equal(loaded.read(0, len(loaded)), valid_stream_ref)
  np.testing.assert_array_equal(loaded.offsets, stream.TokenStream(ptb.sources['valid'], in_memory=False).offsets)
  np.testing.assert_array_equal(loaded._records[5], valid_stream_ref[loaded.offsets[5]:loaded.offsets[6]])

  nowhere = tmp_path / 'missing' / 'test.stream.npz'  # a folder that cannot be written (even by root)
  fallback = stream.cached_records(ptb.sources['test'], nowhere)
  assert not nowhere.parent.exists() and isinstance(fallback, stream.FlatRecords)
  np.testing.assert_array_equal(stream.TokenStream(fallback).read(0, 100), ptb.stream('test').read(0, 100))


def test_train_blocks_overlap_by_one_and_tile_the_stream(ptb, valid_stream_ref):
  src = blocks.TrainBlocks(ptb.stream('valid'), SEQ_LEN)
  assert len(src) == (len(valid_stream_ref) - 1) // SEQ_LEN
  for i in [0, 1, 2, len(src) // 2, len(src) - 1]:
    ex = src[i]
    assert ex['inputs'].shape == ex['targets'].shape == ex['weights'].shape == (SEQ_LEN,)
    np.testing.assert_array_equal(ex['inputs'][1:], ex['targets'][:-1])
    start = i * SEQ_LEN
    np.testing.assert_array_equal(ex['inputs'], valid_stream_ref[start : start + SEQ_LEN])
    np.testing.assert_array_equal(ex['targets'], valid_stream_ref[start + 1 : start + SEQ_LEN + 1])
  # Consecutive blocks share one token: the last target of i is the first input of i + 1.
  assert src[3]['targets'][-1] == src[4]['inputs'][0]


def _rows(batch_list, key='inputs'):
  return [row.tobytes() for b in batch_list for row in b[key]]


def test_train_epochs_are_permutations_of_the_blocks_reshuffled_each_epoch(ptb, valid_stream_ref):
  batch = 7
  valid = ptb.stream('valid')
  num_blocks = (len(valid) - 1) // SEQ_LEN
  assert num_blocks % batch == 0  # 2107 = 7 * 301, so epochs align with batches.
  ds = pipeline.train_dataset(valid, batch, SEQ_LEN, seed=3)
  per_epoch = num_blocks // batch
  epoch0 = [ds[i] for i in range(per_epoch)]
  epoch1 = [ds[i] for i in range(per_epoch, 2 * per_epoch)]
  reference = [valid_stream_ref[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN].tobytes() for i in range(num_blocks)]
  assert sorted(_rows(epoch0)) == sorted(reference)
  assert sorted(_rows(epoch1)) == sorted(reference)
  assert _rows(epoch0) != _rows(epoch1)
  assert _rows(epoch0) != reference  # Shuffled.
  for b in epoch0[:3]:
    np.testing.assert_array_equal(b['inputs'][:, 1:], b['targets'][:, :-1])
    assert b['weights'].dtype == np.float32 and np.all(b['weights'] == 1)
  other_seed = pipeline.train_dataset(valid, batch, SEQ_LEN, seed=4)
  assert _rows([other_seed[0]]) != _rows(epoch0[:1])


def test_train_iterator_resumes_exactly_from_state(ptb):
  it = ptb.train_iterator(BATCH, SEQ_LEN, seed=0)
  first = next(it)
  assert first['inputs'].shape == (BATCH, SEQ_LEN) and first['inputs'].dtype == np.int32
  assert first['targets'].dtype == np.int32 and first['weights'].dtype == np.float32
  for _ in range(4):
    next(it)
  state = it.get_state()
  json.dumps(state)  # Checkpointable as JSON.
  expected = [next(it) for _ in range(6)]
  fresh = ptb.train_iterator(BATCH, SEQ_LEN, seed=0)
  fresh.set_state(state)
  resumed = [next(fresh) for _ in range(6)]
  for a, b in zip(expected, resumed):
    for key in ('inputs', 'targets', 'weights'):
      np.testing.assert_array_equal(a[key], b[key])
  # Same seed, fresh start: the same first batch.
  np.testing.assert_array_equal(next(ptb.train_iterator(BATCH, SEQ_LEN, seed=0))['inputs'], first['inputs'])


def test_shards_are_disjoint_slices_of_the_global_batch(ptb):
  global_it = ptb.train_iterator(BATCH, SEQ_LEN, seed=1)
  shards = [ptb.train_iterator(BATCH, SEQ_LEN, seed=1, shard_index=k, shard_count=4) for k in range(4)]
  for _ in range(3):
    g = next(global_it)
    parts = [next(s) for s in shards]
    assert parts[0]['inputs'].shape == (BATCH // 4, SEQ_LEN)
    for key in ('inputs', 'targets'):
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), g[key])
  with pytest.raises(ValueError, match='multiple of shard_count'):
    ptb.train_iterator(10, SEQ_LEN, seed=1, shard_index=0, shard_count=4)


def test_eval_batches_cover_every_target_once_in_order(ptb, valid_stream_ref):
  batches = list(ptb.eval_batches('valid', BATCH, SEQ_LEN))
  n = len(valid_stream_ref)
  assert ptb.split_num_tokens('valid') == n
  num_rows = math.ceil((n - 1) / SEQ_LEN)
  assert len(batches) == math.ceil(num_rows / BATCH)
  for b in batches:
    assert b['inputs'].shape == b['targets'].shape == b['weights'].shape == (BATCH, SEQ_LEN)
    assert b['inputs'].dtype == np.int32 and b['weights'].dtype == np.float32
  weights = np.concatenate([b['weights'].reshape(-1) for b in batches])
  assert weights.sum() == n - 1
  mask = weights > 0
  # Real tokens come first, padding only at the end.
  assert mask[: n - 1].all() and not mask[n - 1 :].any()
  inputs = np.concatenate([b['inputs'].reshape(-1) for b in batches])
  targets = np.concatenate([b['targets'].reshape(-1) for b in batches])
  np.testing.assert_array_equal(inputs[mask], valid_stream_ref[:-1])
  np.testing.assert_array_equal(targets[mask], valid_stream_ref[1:])
  assert not inputs[~mask].any() and not targets[~mask].any()  # Pad id 0.
  again = list(ptb.eval_batches('valid', BATCH, SEQ_LEN))
  for a, b in zip(batches, again):
    np.testing.assert_array_equal(a['targets'], b['targets'])

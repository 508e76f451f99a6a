"""The grain reader of prepared shards against today's pipeline on PTB (the default's batches must not change)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.lm import grain_reader
from stablemoe_jax.data.lm import pipeline
from stablemoe_jax.data.prepare import lm as prepare

from tests.conftest import make_tiny_config


def _data_settings(ptb_dir: pathlib.Path) -> LMDataSettings:
  return LMDataSettings(corpus='ptb', data_dir=str(ptb_dir), tokenizer='word', sentencepiece_vocab_size=8000)


@pytest.fixture(scope='module')
def both(ptb_dir, tmp_path_factory):
  """(today's LMData via TFDS, LMData read from prepare's shards: 5 train shards, 4096-token records)."""
  today = pipeline.load_lm_data(_data_settings(ptb_dir), tmp_path_factory.mktemp('tfds'))
  sharded_dir = tmp_path_factory.mktemp('shards')
  prepare.prepare(_data_settings(ptb_dir), sharded_dir, prepare.Options(shard_mb=1, workers=0, progress=False))
  return today, pipeline.load_lm_data(_data_settings(ptb_dir), sharded_dir)


def _assert_same_batches(a, b, count: int):
  for _ in range(count):
    x, y = next(a), next(b)
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])
      assert x[key].dtype == y[key].dtype


def test_main_reads_the_shards_and_every_split_is_todays_stream(both):
  today, sharded = both
  assert isinstance(sharded, grain_reader.ShardedLMData) and not isinstance(today, grain_reader.ShardedLMData)
  assert sharded.tokenizer.fingerprint() == today.tokenizer.fingerprint()
  assert len(sharded.stream('train').offsets) > 200  # Many records over several shards.
  for split in ('train', 'valid', 'test'):
    a, b = today.stream(split), sharded.stream(split)
    np.testing.assert_array_equal(a.read(0, len(a)), b.read(0, len(b)))


@pytest.mark.parametrize('in_memory', [True, False])
def test_train_batches_of_the_default_equal_todays_across_epochs_and_processes(both, ptb_dir, in_memory):
  today, sharded = both
  if not in_memory:
    manifest_dir = pathlib.Path(sharded.stream('train')._records._paths[0]).parents[2]
    streams = grain_reader.open_splits(manifest_dir, json.loads((manifest_dir / 'prepared.json').read_text()), False)
    sharded = dataclasses.replace(sharded, streams=streams, sources={s: v._records for s, v in streams.items()})
    assert not sharded.stream('train').in_memory
  train = make_tiny_config(ptb_dir).train
  # The default's shape (16 x 128, seed 0), then a small one long enough to cross an epoch boundary.
  _assert_same_batches(today.train_iterator(16, 128, 0), sharded.train_iterator(16, 128, 0), 30)
  blocks = (len(today.stream('train')) - 1) // 2048
  _assert_same_batches(today.train_iterator(8, 2048, 3), sharded.train_iterator(8, 2048, 3), blocks // 8 + 3)
  for index in range(2):
    _assert_same_batches(today.train_iterator(train.batch_size, 64, 1, index, 2),
                         sharded.train_iterator(train.batch_size, 64, 1, index, 2), 10)
  a, b = list(today.eval_batches('valid', 32, 128)), list(sharded.eval_batches('valid', 32, 128))
  _assert_same_batches(iter(a), iter(b), len(a))


def test_sharded_train_iterator_resumes_exactly(both):
  _, sharded = both
  it = sharded.train_iterator(16, 128, 0)
  for _ in range(7):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(5)]
  resumed = sharded.train_iterator(16, 128, 0)
  resumed.set_state(state)
  _assert_same_batches(iter(expected), resumed, 5)

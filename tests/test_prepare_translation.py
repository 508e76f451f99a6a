"""Translation pairs in array_record files: the sharded reader's training batches equal the in-memory ones."""
from __future__ import annotations

import numpy as np
import pytest
from mt_fixtures import make_tiny_mt_config, write_small_corpora

from stablemoe_jax.data import pair_records
from stablemoe_jax.data import translation as data_lib


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
  corpora = write_small_corpora(tmp_path_factory.mktemp("corpora"))
  config = make_tiny_mt_config(corpora)
  data = data_lib.load_translation_data(config.data, tmp_path_factory.mktemp("prepared"))
  in_memory = data.split_sets("train")
  directory = tmp_path_factory.mktemp("records")
  on_disk = []
  for s in in_memory:
    path = directory / f"{s.pair}.{s.name}.array_record"
    assert pair_records.write_pairs(path, ((s.source(i), s.target(i)) for i in range(len(s)))) == len(s)
    on_disk.append(pair_records.RecordSet(s.pair, s.name, path))
  return config, in_memory, on_disk


def _batches(iterator, count):
  return [next(iterator) for _ in range(count)]


def test_records_hold_every_pair(sets):
  _, in_memory, on_disk = sets
  for memory, disk in zip(in_memory, on_disk):
    assert len(memory) == len(disk)
    for i in (0, len(memory) // 2, len(memory) - 1):
      np.testing.assert_array_equal(memory.source(i), disk.source(i))
      np.testing.assert_array_equal(memory.target(i), disk.target(i))
    for max_len in (8, 32):
      np.testing.assert_array_equal(memory.fitting(max_len), disk.fitting(max_len))


def test_record_batches_equal_in_memory_batches_and_resume_exactly(sets):
  config, in_memory, on_disk = sets
  make = lambda s: data_lib.MixedPairIterator(s, config.train.batch_size, config.train.seq_len, seed=3,
                                              temperature=5.0)
  expected = _batches(make(in_memory), 6)
  reader = make(on_disk)
  got = _batches(reader, 3)
  state = reader.get_state()
  resumed = make(on_disk)
  resumed.set_state(state)
  got += _batches(resumed, 3)
  for a, b in zip(expected, got):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])

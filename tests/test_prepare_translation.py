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


def test_aligned_shards_cut_both_files_at_the_same_lines(tmp_path):
  from stablemoe_jax.data import shards
  source, target = tmp_path / "a.de", tmp_path / "a.en"
  source.write_text("".join(f"quelle {i}\n" * (i % 3 != 1) or "\n" for i in range(23)), encoding="utf-8")
  target.write_text("".join(f"target number {i} is longer\n" for i in range(23)), encoding="utf-8")
  for shard_lines in (1, 5, 23, 100):
    specs = shards.plan_aligned("train", source, target, shard_lines, "s")
    assert len(specs) == -(-23 // shard_lines)
    pairs = [p for spec in specs for p in shards.iter_aligned_pairs(spec)]
    expected = list(zip(source.read_text().split("\n")[:-1], target.read_text().split("\n")[:-1]))
    assert pairs == expected


def test_misaligned_files_are_one_clear_error_naming_both(tmp_path):
  from stablemoe_jax.data import shards
  source, target = tmp_path / "b.fr", tmp_path / "b.en"
  source.write_text("un\ndeux\ntrois\n")
  target.write_text("one\ntwo\n")
  with pytest.raises(shards.MisalignedError, match=r"b\.fr has 3 lines but .*b\.en has 2"):
    shards.plan_aligned("train", source, target, 2, "s")

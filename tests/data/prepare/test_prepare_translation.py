"""Translation at scale: `prepare` of a translation config (aligned pair shards on Beam) and the sharded reader."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.mt_fixtures import make_tiny_mt_config, write_small_corpora

from stablemoe_jax.core.settings import from_config
from stablemoe_jax.data.common import shards
from stablemoe_jax.data.prepare import lm as prepare
from stablemoe_jax.data.prepare import translation as prepare_translation
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.data.translation import corpora as parallel
from stablemoe_jax.data.translation import pair_records
from stablemoe_jax.data.translation import pipeline as data_lib


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
  corpora = write_small_corpora(tmp_path_factory.mktemp("corpora"))
  config = make_tiny_mt_config(corpora)
  data = data_lib.load_translation_data(from_config(config).data, tmp_path_factory.mktemp("prepared"))
  in_memory = data.split_sets("train")
  directory = tmp_path_factory.mktemp("records")
  on_disk = []
  for s in in_memory:
    path = directory / f"{s.pair}.{s.name}.array_record"
    assert pair_records.write_pairs(path, ((s.source(i), s.target(i)) for i in range(len(s)))) == len(s)
    on_disk.append(pair_records.RecordSet(s.pair, s.name, [path]))
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
  make = lambda s: batch_lib.MixedPairIterator(s, config.train.batch_size, config.train.seq_len, seed=3,
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
  source, target = tmp_path / "b.fr", tmp_path / "b.en"
  source.write_text("un\ndeux\ntrois\n")
  target.write_text("one\ntwo\n")
  with pytest.raises(shards.MisalignedError, match=r"b\.fr has 3 lines but .*b\.en has 2"):
    shards.plan_aligned("train", source, target, 2, "s")


OPTIONS = prepare.Options(shard_pairs=700, batch_lines=100, workers=0, progress=False)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """(config, workdir/data) of a preparation of the tiny corpora, inline (no Beam)."""
  corpora = write_small_corpora(tmp_path_factory.mktemp("corpora"))
  config = make_tiny_mt_config(corpora)
  prepared_dir = tmp_path_factory.mktemp("workdir") / "data"
  prepare_translation.prepare(from_config(config).data, prepared_dir, OPTIONS)
  return config, prepared_dir


def _shard_bytes(prepared_dir):
  root = prepared_dir / "translation" / "shards"
  # Keyed by set and index: the Bible's shard names hold the path of its sets' files, under prepared_dir.
  return {p.name.rsplit("-", 1)[0]: p.read_bytes() for p in sorted(root.glob("*/*.array_record"))}


def test_prepared_records_are_the_pairs_encoded_as_main_encodes_them(prepared):
  config, prepared_dir = prepared
  data = data_lib.load_translation_data(from_config(config).data, prepared_dir)
  raw = parallel.read_sets(config.data.data_dir and __import__("pathlib").Path(config.data.data_dir),
                           ("de-en", "fr-en", "cs-en", "es-en"), ("Ruth",), ("Jonah",))
  for pair, named in raw.items():
    for name, ps in named.items():
      expected, got = batch_lib.encode_set(data.tokenizer, ps), data.sets[pair][name]
      assert len(got) == len(expected) > 0
      if name == "train":
        assert isinstance(got, pair_records.RecordSet) and len(got.paths) == -(-len(expected) // 700)
      for i in range(len(expected)):
        np.testing.assert_array_equal(got.source(i), expected.source(i))
        np.testing.assert_array_equal(got.target(i), expected.target(i))
  assert data.raw_text("de-en", "valid") == (list(raw["de-en"]["valid"].sources), list(raw["de-en"]["valid"].targets))
  in_memory = {p: {n: batch_lib.encode_set(data.tokenizer, ps) for n, ps in named.items()} for p, named in raw.items()}
  memory = data_lib.TranslationData(data.tokenizer, in_memory, data.directory)
  np.testing.assert_array_equal(data.train_token_counts(data.vocab_size), memory.train_token_counts(data.vocab_size))
  assert data.length_report(16) == memory.length_report(16)


def test_two_beam_workers_write_the_same_bytes_as_one_process(prepared, tmp_path):
  config, prepared_dir = prepared
  beam_dir = tmp_path / "data"
  report = prepare_translation.prepare(from_config(config).data, beam_dir, dataclasses.replace(OPTIONS, workers=2))
  assert report["shards_written"] == report["shards"] > 4
  assert _shard_bytes(beam_dir) == _shard_bytes(prepared_dir)


def test_resume_redoes_only_the_missing_shards(prepared, tmp_path):
  config, prepared_dir = prepared
  copy = tmp_path / "data"  # Prepared afresh: the Bible's sets are files under it, named by their path.
  prepare_translation.prepare(from_config(config).data, copy, OPTIONS)
  markers = sorted((copy / "translation" / "shards").glob("*/*.json"))
  for marker in markers[::3]:  # As if killed before these shards finished.
    marker.unlink()
    marker.with_suffix(".array_record").unlink()
  report = prepare_translation.prepare(from_config(config).data, copy, OPTIONS)
  assert report["shards_written"] == len(markers[::3]) and report["shards_reused"] == len(markers) - len(markers[::3])
  assert _shard_bytes(copy) == _shard_bytes(prepared_dir)

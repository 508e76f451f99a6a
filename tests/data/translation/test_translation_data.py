"""Translation data: held-out books, tags and special ids, pair mixing, exact resume, over-length counts."""
from __future__ import annotations

import numpy as np
import pytest
from tests.mt_fixtures import make_tiny_mt_config, write_small_corpora

from stablemoe_jax.core.errors import DataNotFoundError
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.data.translation import corpora as parallel
from stablemoe_jax.data.translation import pipeline as data_lib
from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, EOS_ID, UNK_ID
from stablemoe_jax.models.seq2seq import PAD_ID


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  return write_small_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.fixture(scope="module")
def prepared(corpora, tmp_path_factory):
  config = make_tiny_mt_config(corpora)
  workdir = tmp_path_factory.mktemp("prepared")
  return config, workdir, data_lib.load_translation_data(from_config(config).data, workdir)


def test_held_out_books_are_never_trained_on(corpora):
  sets = parallel.bible_sets(corpora, ("Ruth",), ("Jonah",))
  keys = (corpora / "bible_es_en" / "keys.txt").read_text().splitlines()
  verses = (corpora / "bible_es_en" / "bible.es").read_text().splitlines()
  ruth = {v for v, k in zip(verses, keys) if k.startswith("Ruth.")}
  jonah = {v for v, k in zip(verses, keys) if k.startswith("Jonah.")}
  assert set(sets["valid"].sources) == ruth and set(sets["bible_test"].sources) == jonah
  assert not (set(sets["train"].sources) & (ruth | jonah))
  assert len(sets["train"].sources) + len(ruth) + len(jonah) == len(verses)


def test_unknown_book_and_missing_file_are_one_clear_error(corpora, tmp_path):
  with pytest.raises(ValueError, match="Revelation"):
    parallel.bible_sets(corpora, ("Revelation",), ())
  with pytest.raises(DataNotFoundError, match="train.de"):
    parallel.multi30k_sets(tmp_path, "de")


def test_sources_start_with_their_tag_and_special_ids_are_distinct(prepared):
  _, _, data = prepared
  tokenizer = data.tokenizer
  assert len({PAD_ID, UNK_ID, BOS_ID, EOS_ID}) == 4
  for pair in data.pairs:
    train = data.sets[pair]["train"]
    tag = tokenizer.tag_id(pair.split("-")[0])
    assert all(train.source(i)[0] == tag and train.source(i)[-1] == EOS_ID for i in range(20))
  batch = next(iter(batch_lib.eval_batches(data.split_sets("valid"), 4, 32)))
  np.testing.assert_array_equal(batch["decoder_inputs"][:, 0], BOS_ID)
  shifted = np.where(batch["targets"][:, :-1] == EOS_ID, PAD_ID, batch["targets"][:, :-1])
  np.testing.assert_array_equal(batch["decoder_inputs"][:, 1:], shifted)  # the targets shifted by one, no eos
  assert batch["weights"].sum() == (batch["targets"] != PAD_ID).sum()


def test_mixing_weights_follow_the_temperature():
  np.testing.assert_allclose(batch_lib.mixing_weights([100, 300], 1.0), [0.25, 0.75])
  np.testing.assert_allclose(batch_lib.mixing_weights([100, 400], 2.0), [1 / 3, 2 / 3])


def test_training_batches_resume_exactly_and_split_over_processes(prepared):
  config, _, data = prepared
  make = lambda index=0, count=1: batch_lib.MixedPairIterator(data.split_sets("train"), 8, 32, 0, 1.0, index, count)
  first = make()
  batches = [next(first) for _ in range(3)]
  resumed = make()
  resumed.set_state(first.get_state() | {"batches": 2})
  np.testing.assert_array_equal(next(resumed)["source"], batches[2]["source"])
  halves = [next(make(i, 2))["source"] for i in range(2)]
  np.testing.assert_array_equal(np.concatenate(halves), batches[0]["source"])


def test_over_length_pairs_are_counted_and_reported(prepared):
  config, workdir, data = prepared
  report = data_lib.write_length_report(data, workdir, 12, 32)
  over = report["over_train_seq_len"]
  for pair in data.pairs:
    for name, s in data.sets[pair].items():
      assert over.get(pair, {}).get(name, 0) == len(s) - len(s.fitting(12))
  assert sum(n for sets in over.values() for n in sets.values()) > 0
  assert (workdir / "translation" / data_lib.LENGTH_REPORT).is_file()


def test_a_prepared_workdir_needs_no_raw_corpus(prepared):
  config, workdir, data = prepared
  config.data.data_dir = "/nonexistent"
  again = data_lib.load_translation_data(from_config(config).data, workdir)
  assert again.tokenizer.fingerprint() == data.tokenizer.fingerprint()
  np.testing.assert_array_equal(again.sets["de-en"]["train"].source_ids, data.sets["de-en"]["train"].source_ids)



def _synthetic_set(pair: str, lengths: list[int], first_id: int = 10) -> batch_lib.EncodedSet:
  """A set whose pair i has a source of lengths[i] ids and a target of lengths[i] - 1 ids, all ids first_id + i."""
  sources = [[first_id + i] * n for i, n in enumerate(lengths)]
  targets = [[first_id + i] * (n - 1) for i, n in enumerate(lengths)]
  return batch_lib.EncodedSet(pair, "train", *batch_lib._flatten(sources), *batch_lib._flatten(targets))


def test_length_buckets_halve_down_from_the_sequence_length():
  assert batch_lib.length_buckets(3, 64) == (16, 32, 64)
  assert batch_lib.length_buckets(1, 64) == (64,)
  with pytest.raises(ValueError, match="length_buckets=4 needs train.seq_len=36"):
    batch_lib.length_buckets(4, 36)


def test_one_bucket_draws_rows_as_the_documented_process():
  sets = [_synthetic_set("de-en", [3, 5, 9, 30]), _synthetic_set("es-en", [7, 20, 40])]
  iterator = batch_lib.MixedPairIterator(sets, 6, 32, seed=4, temperature=2.0)
  weights = np.sqrt([4.0, 2.0]) / np.sqrt([4.0, 2.0]).sum()  # es-en's 40 does not fit 32
  fits = [np.array([0, 1, 2, 3]), np.array([0, 1])]
  for t in range(3):
    rng = np.random.default_rng([4, t])
    pairs = rng.choice(2, size=6, p=weights)
    expected = [sets[p].source(int(fits[p][rng.integers(len(fits[p]))])) for p in pairs]
    batch = next(iterator)
    assert batch["source"].shape == (6, 32)
    for row, src in zip(batch["source"], expected):
      np.testing.assert_array_equal(row, np.pad(src, (0, 32 - len(src))))


def test_length_buckets_keep_every_sentences_share_and_cut_padding():
  """Bucketed batches are [B * 32 / L, L] with each pair in its shortest fitting bucket; every sentence's share of
  the rows is the one-bucket process's, weight(pair) / n_pair (here 1 / 12: proportional mixing of 12 fitting
  pairs), and a batch carries 32 / sum_L(L * mass_L) = 1.5 times the rows (4 / 12, 2 / 12, 6 / 12 of the mass
  at L = 8, 16, 32)."""
  lengths = {"de-en": [3, 5, 8, 9, 16, 17, 30], "es-en": [7, 20, 25, 31, 32, 40]}  # 40 fits no bucket
  sets = [_synthetic_set("de-en", lengths["de-en"], 10), _synthetic_set("es-en", lengths["es-en"], 100)]
  size_of = {10 + i: n for i, n in enumerate(lengths["de-en"])} | {100 + i: n for i, n in enumerate(lengths["es-en"])}
  batch_size, max_len, batches = 4, 32, 6000
  iterator = batch_lib.MixedPairIterator(sets, batch_size, max_len, seed=0, temperature=1.0,
                                        length_buckets=(8, 16, 32))
  rows_of = {first: 0 for first in size_of}
  shapes = set()
  for _ in range(batches):
    batch = next(iterator)
    rows, length = batch["source"].shape
    shapes.add((rows, length))
    for row, target in zip(batch["source"], batch["targets"]):
      size = size_of[int(row[0])]
      assert size <= length and (length == 8 or size > length // 2)  # its shortest fitting bucket
      np.testing.assert_array_equal(row[:size], row[0])
      assert target[size - 1] == EOS_ID  # size - 1 target ids, then eos
      rows_of[int(row[0])] += 1
  assert shapes == {(16, 8), (8, 16), (4, 32)}
  assert rows_of[105] == 0  # es-en's 40
  total = sum(rows_of.values())
  assert abs(total / (batches * batch_size) - 1.5) < 0.02
  for first, count in rows_of.items():
    if first != 105:
      assert abs(count - total / 12) < 5 * np.sqrt(total / 12), (first, count, total / 12)

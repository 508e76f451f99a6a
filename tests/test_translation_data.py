"""Translation data: held-out books, tags and special ids, pair mixing, exact resume, over-length counts."""
from __future__ import annotations

import numpy as np
import pytest
from mt_fixtures import make_tiny_mt_config, write_small_corpora

from stablemoe_jax.data import DataNotFoundError
from stablemoe_jax.data import parallel
from stablemoe_jax.data import translation as data_lib
from stablemoe_jax.data.joint_tokenizer import BOS_ID, EOS_ID, UNK_ID
from stablemoe_jax.models.seq2seq import PAD_ID


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  return write_small_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.fixture(scope="module")
def prepared(corpora, tmp_path_factory):
  config = make_tiny_mt_config(corpora)
  workdir = tmp_path_factory.mktemp("prepared")
  return config, workdir, data_lib.load_translation_data(config.data, workdir)


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
  batch = next(iter(data_lib.eval_batches(data.split_sets("valid"), 4, 32)))
  np.testing.assert_array_equal(batch["decoder_inputs"][:, 0], BOS_ID)
  shifted = np.where(batch["targets"][:, :-1] == EOS_ID, PAD_ID, batch["targets"][:, :-1])
  np.testing.assert_array_equal(batch["decoder_inputs"][:, 1:], shifted)  # the targets shifted by one, no eos
  assert batch["weights"].sum() == (batch["targets"] != PAD_ID).sum()


def test_mixing_weights_follow_the_temperature():
  np.testing.assert_allclose(data_lib.mixing_weights([100, 300], 1.0), [0.25, 0.75])
  np.testing.assert_allclose(data_lib.mixing_weights([100, 400], 2.0), [1 / 3, 2 / 3])


def test_training_batches_resume_exactly_and_split_over_processes(prepared):
  config, _, data = prepared
  make = lambda index=0, count=1: data_lib.MixedPairIterator(data.split_sets("train"), 8, 32, 0, 1.0, index, count)
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
  again = data_lib.load_translation_data(config.data, workdir)
  assert again.tokenizer.fingerprint() == data.tokenizer.fingerprint()
  np.testing.assert_array_equal(again.sets["de-en"]["train"].source_ids, data.sets["de-en"]["train"].source_ids)

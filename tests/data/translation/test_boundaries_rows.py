"""Translation data at its edges (issue 51): a ``files`` corpus without its prepared shards refused before the
workdir is written; ``make_rows``' fit check on each side (source, target + eos) at exactly ``max_len``; the batch
over the processes; the length buckets. No training."""
from __future__ import annotations

import json

import numpy as np
import pytest

from configs import mt_files
from stablemoe_jax.core.errors import DataError, DataNotFoundError
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.data.translation import pipeline as mt_pipeline
from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, EOS_ID
from stablemoe_jax.experiment import config_validation, loop


# --- a translation `files` corpus without its prepared shards --------------------------------------------------------

def _mt_files_config():
  config = mt_files.get_config()
  config.data.pairs = "de-en,fr-en"
  for split in ("train", "valid", "test"):
    config.data[f"{split}_files"] = f"/nonexistent/{{pair}}/{split}.{{lang}}"
  return config


def test_mt_files_with_pairs_and_no_prepared_shards_stops_before_the_workdir_is_written(tmp_path):
  workdir = tmp_path / "run"
  with pytest.raises(DataNotFoundError) as error:
    loop.Experiment(_mt_files_config(), workdir)
  message = str(error.value)
  assert message.startswith(f"data.corpus='files' is read from shards that {workdir / 'data'} does not hold: "
                            f"prepare them first with `python -m stablemoe_jax.prepare --config CONFIG "
                            f"--workdir {workdir} --workers 8 --config.data.pairs='de-en,fr-en' "
                            f"--config.data.train_files='/nonexistent/{{pair}}/train.{{lang}}'")
  assert "\n" not in message and not workdir.exists()


def test_mt_files_with_its_prepared_manifest_is_not_refused(tmp_path):
  manifest = tmp_path / "run" / "data" / "translation" / mt_pipeline.MANIFEST
  config = _mt_files_config()
  with pytest.raises(DataNotFoundError, match="--config configs/mt_files.py "):
    config_validation.check_prepared(config, tmp_path / "run", "configs/mt_files.py")
  manifest.parent.mkdir(parents=True)
  manifest.write_text(json.dumps({}))
  config_validation.check_prepared(config, tmp_path / "run", "configs/mt_files.py")  # no error


# --- make_rows: a pair fits max_len or is one line ------------------------------------------------------------------

def _one_pair(source_len: int, target_len: int) -> batch_lib.EncodedSet:
  """A set of one pair: ``source_len`` source ids (tag and eos included), ``target_len`` bare target ids."""
  source = [[7] + list(range(10, 10 + source_len - 2)) + [EOS_ID]]
  target = [list(range(100, 100 + target_len))]
  return batch_lib.EncodedSet("de-en", "valid", *batch_lib._flatten(source), *batch_lib._flatten(target))


def test_a_target_of_max_len_minus_1_ids_fits_with_its_eos_in_the_last_position():
  batch = batch_lib.make_rows([(_one_pair(3, 7), 0)], rows=2, max_len=8)
  np.testing.assert_array_equal(batch["targets"][0], list(range(100, 107)) + [EOS_ID])
  np.testing.assert_array_equal(batch["decoder_inputs"][0], [BOS_ID] + list(range(100, 107)))
  np.testing.assert_array_equal(batch["weights"], [[1] * 8, [0] * 8])


def test_a_target_of_exactly_max_len_ids_is_the_one_line_error():
  """The source (3 positions) fits: only the target's branch of the check can refuse it."""
  with pytest.raises(ValueError) as error:
    batch_lib.make_rows([(_one_pair(3, 8), 0)], rows=1, max_len=8)
  assert str(error.value) == ("a pair of de-en valid does not fit 8 positions (source 3, target + eos 9); pass pairs "
                              "that fit.")


@pytest.mark.parametrize("source_len, fits", [(8, True), (9, False)])
def test_a_source_fits_up_to_exactly_max_len_positions(source_len, fits):
  rows = [(_one_pair(source_len, 2), 0)]
  if fits:
    assert batch_lib.make_rows(rows, rows=1, max_len=8)["source"][0, -1] == EOS_ID
  else:
    with pytest.raises(ValueError, match=r"does not fit 8 positions \(source 9, target \+ eos 3\)"):
      batch_lib.make_rows(rows, rows=1, max_len=8)


def _pairs(lengths: list[tuple[int, int]]) -> batch_lib.EncodedSet:
  """One set, a pair per (source positions, target ids)."""
  sources = [[7] + [11] * (s - 2) + [EOS_ID] for s, _ in lengths]
  targets = [[12] * t for _, t in lengths]
  return batch_lib.EncodedSet("de-en", "train", *batch_lib._flatten(sources), *batch_lib._flatten(targets))


def test_the_pairs_that_fit_are_those_make_rows_accepts():
  encoded = _pairs([(8, 7), (9, 7), (8, 8), (3, 0), (2, 1)])
  np.testing.assert_array_equal(encoded.fitting(8), [0, 3, 4])
  batch_lib.make_rows([(encoded, int(i)) for i in encoded.fitting(8)], rows=3, max_len=8)
  for refused in (1, 2):
    with pytest.raises(ValueError, match="does not fit 8 positions"):
      batch_lib.make_rows([(encoded, refused)], rows=1, max_len=8)


@pytest.mark.parametrize("lengths, fits", [([(8, 7)], True), ([(9, 7), (8, 8)], False)])
def test_training_needs_one_pair_of_each_language_pair_that_fits(lengths, fits):
  make = lambda: batch_lib.MixedPairIterator([_pairs(lengths)], batch_size=2, max_len=8, seed=0, temperature=1.0)
  if fits:
    assert next(make())["source"].shape == (2, 8)
  else:
    with pytest.raises(DataError, match=r"no training pair of de-en fits train.seq_len=8; raise it."):
      make()


@pytest.mark.parametrize("batch_size, processes, ok", [(4, 2, True), (4, 4, True), (6, 4, False)])
def test_the_batch_splits_evenly_over_the_processes(batch_size, processes, ok):
  make = lambda: batch_lib.MixedPairIterator([_pairs([(4, 3)])], batch_size, 8, seed=0, temperature=1.0,
                                             shard_count=processes)
  if ok:
    assert next(make())["source"].shape == (batch_size // processes, 8)
  else:
    with pytest.raises(ValueError, match=f"train.batch_size={batch_size} must be a multiple of the {processes}"):
      make()


@pytest.mark.parametrize("count, max_len, buckets", [(1, 64, (64,)), (3, 64, (16, 32, 64)), (7, 64, (1, 2, 4, 8,
                                                                                                     16, 32, 64))])
def test_length_buckets_halve_down_to_the_last_even_split(count, max_len, buckets):
  assert batch_lib.length_buckets(count, max_len) == buckets


@pytest.mark.parametrize("count, max_len", [(0, 64), (8, 64), (2, 63)])
def test_length_buckets_that_do_not_halve_evenly_are_refused(count, max_len):
  with pytest.raises(ValueError, match=f"data.length_buckets={count} needs train.seq_len={max_len} divisible"):
    batch_lib.length_buckets(count, max_len)

"""Prepared data without the raw corpus: a run served from the records alone; another config's records refused."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from stablemoe_jax.data.common import locate
from stablemoe_jax.data.lm import pipeline as data_lib
from tests.data.conftest import _data_settings, _eval_targets


# --- prepared data without the raw corpus ---------------------------------------


def test_prepared_data_serves_a_run_without_the_raw_corpus(ptb, prepared_dir, valid_stream_ref, tmp_path,
                                                           monkeypatch):
  monkeypatch.delenv(locate.ENV_VAR, raising=False)
  for configured in ('', str(tmp_path / 'nowhere')):
    lm = data_lib.load_lm_data(_data_settings(configured), prepared_dir)
    assert lm.tokenizer.fingerprint() == ptb.tokenizer.fingerprint() and lm.vocab_size == 10000
    np.testing.assert_array_equal(_eval_targets(lm, 'valid'), valid_stream_ref[1:])
  assert len(lm.sources['train']) == len(ptb.sources['train'])  # same records (lines) in the train split
  with pytest.raises(locate.DataNotFoundError):  # Nothing prepared there: the raw corpus is needed.
    data_lib.load_lm_data(_data_settings(''), tmp_path / 'empty')


def test_prepared_data_of_another_config_is_refused(ptb, prepared_dir, tmp_path, monkeypatch):
  monkeypatch.delenv(locate.ENV_VAR, raising=False)
  for config, named in ((_data_settings('', tokenizer='sentencepiece'), "data.tokenizer='sentencepiece'"),
                        (_data_settings('', corpus='text'), "data.corpus='text'")):
    with pytest.raises(locate.DataError, match='does not match this config') as err:
      data_lib.load_lm_data(config, prepared_dir)
    assert named in str(err.value) and '--config.data.data_dir' in str(err.value)
  # A tokenizer that is not the one the records were written with (two words swapped).
  copy = tmp_path / 'copy'
  shutil.copytree(prepared_dir, copy)
  vocab = (copy / 'tokenizer' / 'vocab.txt').read_text().splitlines()
  vocab[1], vocab[2] = vocab[2], vocab[1]
  (copy / 'tokenizer' / 'vocab.txt').write_text(''.join(w + '\n' for w in vocab))
  with pytest.raises(locate.DataError, match='not the one the records .* were encoded with'):
    data_lib.load_lm_data(_data_settings(''), copy)

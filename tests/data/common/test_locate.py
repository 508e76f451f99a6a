"""Locating data: the missing-folder error, STABLEMOE_DATA_DIR and both PTB layouts, bad config values, a text
corpus with SentencePiece end to end."""
from __future__ import annotations

import numpy as np
import pytest

from stablemoe_jax.data.common import locate
from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.lm import pipeline as data_lib
from tests.data.conftest import _data_settings, _reference_stream


# --- locating data --------------------------------------------------------------


def test_missing_data_dir_error_names_the_fix(tmp_path, monkeypatch):
  monkeypatch.delenv(locate.ENV_VAR, raising=False)
  for configured in ('', str(tmp_path / 'nowhere'), str(tmp_path)):
    with pytest.raises(locate.DataNotFoundError) as err:
      locate.resolve_data_dir(configured)
    message = str(err.value)
    assert 'ptb/ptb.train.txt' in message and 'ptb/ptb.test.txt' in message
    assert '--config.data.data_dir' in message and locate.ENV_VAR in message
    assert 'python -m stablemoe_jax.data.download --dest' in message
  assert issubclass(locate.DataNotFoundError, FileNotFoundError)
  with pytest.raises(locate.DataNotFoundError):
    data_lib.load_lm_data(_data_settings(tmp_path / 'nowhere'), tmp_path / 'prep')


def test_data_dir_from_env_and_both_ptb_layouts(shared_data, ptb_files, tmp_path, monkeypatch):
  monkeypatch.setenv(locate.ENV_VAR, str(shared_data))
  assert locate.resolve_data_dir('') == shared_data
  flat = tmp_path / 'flat'
  flat.mkdir()
  for split, path in ptb_files.items():
    (flat / path.name).symlink_to(path)
  assert locate.corpus_files(flat, 'ptb') == {s: flat / f'ptb.{s}.txt' for s in locate.SPLITS}
  assert locate.resolve_data_dir(str(flat)) == flat


def test_unknown_config_values_raise(shared_data, tmp_path):
  with pytest.raises(ValueError, match="'ptb', 'text'|ptb, text"):
    data_lib.load_lm_data(_data_settings(shared_data, corpus='wiki'), tmp_path)
  with pytest.raises(ValueError, match='word, sentencepiece'):
    data_lib.load_lm_data(_data_settings(shared_data, tokenizer='bpe'), tmp_path)


def test_text_corpus_with_sentencepiece_end_to_end(shared_data, tmp_path):
  """A user's own corpus: DIR/{train,valid,test}.txt, here cut from botchan (CRLF)."""
  raw = (shared_data / 'botchan' / 'botchan.txt').read_bytes().split(b'\r\n')
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'train.txt').write_bytes(b'\r\n'.join(raw[:3000]))
  (corpus / 'valid.txt').write_bytes(b'\r\n'.join(raw[3000:3600]))
  (corpus / 'test.txt').write_bytes(b'\r\n'.join(raw[3600:]))
  lm = data_lib.load_lm_data(_data_settings(corpus, corpus='text', tokenizer='sentencepiece'), tmp_path / 'prep')
  assert lm.vocab_size == 500 and isinstance(lm.tokenizer, tokenizers.SentencePieceTokenizer)
  ref = _reference_stream(lm.tokenizer, corpus / 'valid.txt')
  assert lm.split_num_tokens('valid') == len(ref)
  got = np.concatenate([b['targets'][b['weights'] > 0] for b in lm.eval_batches('valid', 4, 64)])
  np.testing.assert_array_equal(got, ref[1:])
  batch = next(lm.train_iterator(4, 64, seed=0))
  assert batch['inputs'].shape == (4, 64) and batch['inputs'].max() < 500
  config_dirs = list((tmp_path / 'prep' / 'tfds' / 'lm_corpus').iterdir())
  assert [d.name.split('-')[:2] for d in config_dirs] == [['text', 'sentencepiece']]

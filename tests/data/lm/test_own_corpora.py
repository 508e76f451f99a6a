"""Bad own corpora: an empty train split, a Latin-1 file, CRLF and a missing final newline."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from stablemoe_jax.data.common import text
from stablemoe_jax.data.lm import pipeline as data_lib
from tests.data.conftest import _data_settings, _eval_targets


# --- bad own corpora -----------------------------------------------------------


def _write_corpus(directory: pathlib.Path, splits: dict[str, bytes]) -> pathlib.Path:
  directory.mkdir(parents=True)
  for split, content in splits.items():
    (directory / f'{split}.txt').write_bytes(content)
  return directory


def _ptb_lines(ptb_files, split, count):
  return ptb_files[split].read_bytes().split(b'\n')[:count]


def test_empty_train_split_is_one_clear_error_and_writes_nothing(ptb_files, tmp_path):
  corpus = _write_corpus(tmp_path / 'corpus', {'train': b'\n  \n\n', 'valid': b'a b\n', 'test': b'a b\n'})
  with pytest.raises(text.BadCorpusError) as err:
    data_lib.load_lm_data(_data_settings(corpus, corpus='text'), tmp_path / 'prep')
  assert str(err.value) == (f'{corpus / "train.txt"}: the train split is empty (no line with text); '
                            'put one sentence or segment per line in it.')
  assert not (tmp_path / 'prep').exists()


def test_latin1_file_names_file_line_and_byte_and_writes_nothing(ptb_files, tmp_path):
  good = b'\n'.join(_ptb_lines(ptb_files, 'valid', 20)) + b'\n'
  bad = good + 'un caf\xe9 cr\xe8me\n'.encode('latin-1')  # line 21
  corpus = _write_corpus(tmp_path / 'corpus', {'train': good, 'valid': good, 'test': bad})
  with pytest.raises(text.BadCorpusError) as err:
    data_lib.load_lm_data(_data_settings(corpus, corpus='text'), tmp_path / 'prep')
  message = str(err.value)
  assert message.startswith(f'{corpus / "test.txt"}, line 21: byte 0xe9 at column 7 is not UTF-8')
  assert 'iconv -f latin1 -t utf-8' in message and '\n' not in message
  assert not (tmp_path / 'prep').exists()
  # Fixed in place (converted to UTF-8): the same prepared directory now builds.
  (corpus / 'test.txt').write_bytes(bad.decode('latin-1').encode('utf-8'))
  lm = data_lib.load_lm_data(_data_settings(corpus, corpus='text'), tmp_path / 'prep')
  assert lm.split_num_tokens('test') == lm.split_num_tokens('valid') + 4  # 3 words + eos


def test_crlf_and_missing_final_newline_give_the_same_tokens_as_lf(ptb_files, tmp_path):
  lines = {s: _ptb_lines(ptb_files, s, n) for s, n in (('train', 400), ('valid', 60), ('test', 60))}
  lf = _write_corpus(tmp_path / 'lf', {s: b'\n'.join(l) + b'\n' for s, l in lines.items()})
  crlf = _write_corpus(tmp_path / 'crlf', {s: b'\r\n'.join(l).rstrip(b'\r\n') for s, l in lines.items()})
  assert b'\r\n' in (crlf / 'train.txt').read_bytes() and not (crlf / 'train.txt').read_bytes().endswith(b'\n')
  a = data_lib.load_lm_data(_data_settings(lf, corpus='text'), tmp_path / 'prep_lf')
  b = data_lib.load_lm_data(_data_settings(crlf, corpus='text'), tmp_path / 'prep_crlf')
  assert a.tokenizer.fingerprint() == b.tokenizer.fingerprint()
  for split in ('valid', 'test'):
    np.testing.assert_array_equal(_eval_targets(a, split), _eval_targets(b, split))
  assert a.split_num_tokens('train') == b.split_num_tokens('train')
  batch_a, batch_b = next(a.train_iterator(4, 16, seed=0)), next(b.train_iterator(4, 16, seed=0))
  np.testing.assert_array_equal(batch_a['inputs'], batch_b['inputs'])

"""Fixtures of the tests of stablemoe_jax.data on the real corpora (PTB, botchan) in shared/data.

The corpora are found at $STABLEMOE_DATA_DIR or ../shared/data beside the repository. ``ptb`` tokenizes PTB and
writes it to TFDS records once per pytest process; the files that read it are one unit of work under ``-n N``
(``tests/conftest.py``'s SHARED_UNITS), so one worker tokenizes it, as when they were one module.
"""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.common import locate
from stablemoe_jax.data.common import text
from stablemoe_jax.data.lm import pipeline as data_lib


SEQ_LEN = 35
BATCH = 8


@pytest.fixture(scope='session')
def shared_data(ptb_dir) -> pathlib.Path:
  """The shared corpora folder (conftest.py finds it, or fails saying how to point at it)."""
  return ptb_dir


@pytest.fixture(scope='session')
def ptb_files(shared_data) -> dict[str, pathlib.Path]:
  return locate.corpus_files(shared_data, 'ptb')


def _data_settings(data_dir, corpus='ptb', tokenizer='word', sp_vocab=500) -> LMDataSettings:
  """The ``data`` settings ``load_lm_data`` takes (the other keys at their defaults)."""
  return LMDataSettings(corpus=corpus, data_dir=str(data_dir), tokenizer=tokenizer, sentencepiece_vocab_size=sp_vocab)


@pytest.fixture(scope='session')
def prepared_dir(tmp_path_factory) -> pathlib.Path:
  return tmp_path_factory.mktemp('prepared')


@pytest.fixture(scope='session')
def ptb(shared_data, prepared_dir) -> data_lib.LMData:
  return data_lib.load_lm_data(_data_settings(shared_data), prepared_dir)


def _reference_stream(tokenizer, path) -> np.ndarray:
  """The split's token stream computed straight from the raw text."""
  ids = []
  for line in text.iter_lines(path):
    ids.extend(tokenizer.encode(line))
    ids.append(tokenizer.eos_id)
  return np.asarray(ids, dtype=np.int32)


@pytest.fixture(scope='session')
def valid_stream_ref(ptb, ptb_files) -> np.ndarray:
  return _reference_stream(ptb.tokenizer, ptb_files['valid'])


def _eval_targets(lm, split):
  return np.concatenate([b['targets'][b['weights'] > 0] for b in lm.eval_batches(split, 16, 64)])

"""The TFDS builder: array-record files written once, the fingerprint, records equal to the tokenized lines."""
from __future__ import annotations

import pathlib

import numpy as np

from stablemoe_jax.data.common import text
from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.lm import builder


# --- TFDS builder ---------------------------------------------------------------


def test_builder_writes_array_record_and_prepares_once(ptb, prepared_dir, ptb_files):
  b = builder.LmCorpus(
      split_files=ptb_files, tokenizer=ptb.tokenizer, corpus='ptb', data_dir=prepared_dir / 'tfds'
  )
  record_files = sorted(pathlib.Path(b.data_dir).glob('*.array_record*'))
  assert {f.name.split('-')[1].split('.')[0] for f in record_files} == {'train', 'valid', 'test'}
  mtimes = [f.stat().st_mtime_ns for f in record_files]
  b.prepare()
  assert [f.stat().st_mtime_ns for f in record_files] == mtimes  # prepared once: the second call rewrites nothing
  assert b.info.splits['train'].num_examples == 42068
  assert b.info.splits['valid'].num_examples == 3370
  assert b.info.splits['test'].num_examples == 3761
  assert b.builder_config.name.startswith('ptb-word-')


def test_builder_fingerprint_changes_with_tokenizer(ptb, ptb_files):
  other = tokenizers.WordTokenizer.from_file(ptb_files['valid'])
  assert builder.fingerprint(other, ptb_files) != builder.fingerprint(ptb.tokenizer, ptb_files)
  assert builder.fingerprint(ptb.tokenizer, ptb_files) == builder.fingerprint(ptb.tokenizer, dict(ptb_files))


def test_records_equal_tokenized_lines(ptb, ptb_files):
  source = ptb.sources['valid']
  lines = list(text.iter_lines(ptb_files['valid']))
  assert len(source) == len(lines) == 3370
  for i, line in enumerate(lines):
    record = source[i]
    assert record.dtype == np.int32
    np.testing.assert_array_equal(record, ptb.tokenizer.encode(line) + [ptb.tokenizer.eos_id])


def test_split_num_tokens(ptb):
  # The standard PTB counts: words + one <eos> per line.
  assert ptb.split_num_tokens('train') == 887521 + 42068
  assert ptb.split_num_tokens('valid') == 70390 + 3370
  assert ptb.split_num_tokens('test') == 78669 + 3761

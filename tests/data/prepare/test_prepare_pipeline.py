"""`python -m stablemoe_jax.prepare`: Beam workers, resume, invalidation, memory, bad input.

A tiny corpus cut from PTB (train: a plain file of ~9 byte-range shards and a
.gz file that is one larger shard; valid and test: one file each) keeps every
preparation under a second. Most tests run the shard tasks inline (`workers=0`, the same
`process_shard`); the first runs them on Beam with 1 and 2 real worker processes.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.common import text
from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.lm import grain_reader
from stablemoe_jax.data.lm import prepared
from stablemoe_jax.data.prepare import lm as prepare

from tests.conftest import REPO

OPTIONS = prepare.Options(shard_mb=0.01, chunk_tokens=256, batch_lines=50, workers=0, progress=False)


def _lines(path: pathlib.Path, start: int, stop: int) -> list[str]:
  with open(path, encoding='utf-8') as f:
    return f.readlines()[start:stop]


@pytest.fixture
def corpus(ptb_dir, tmp_path) -> pathlib.Path:
  raw = tmp_path / 'raw'
  raw.mkdir()
  train = ptb_dir / 'ptb' / 'ptb.train.txt'
  (raw / 'train_a.txt').write_text(''.join(_lines(train, 0, 900)))
  (raw / 'train_b.txt.gz').write_bytes(gzip.compress(''.join(_lines(train, 900, 1800)).encode()))
  (raw / 'valid.txt').write_text(''.join(_lines(ptb_dir / 'ptb' / 'ptb.valid.txt', 0, 200)))
  (raw / 'test.txt').write_text(''.join(_lines(ptb_dir / 'ptb' / 'ptb.test.txt', 0, 200)))
  return raw


def _data_settings(raw: pathlib.Path, tokenizer='word', **others) -> LMDataSettings:
  return LMDataSettings(corpus='files', data_dir='', tokenizer=tokenizer, sentencepiece_vocab_size=300,
                        train_files=f'{raw}/train_*', valid_files=f'{raw}/valid.txt', test_files=f'{raw}/test.txt',
                        **others)


def _records(prepared_dir: pathlib.Path) -> dict[str, bytes]:
  """{relative path: bytes} of every array_record file, plus the manifest's shard lists."""
  out = {str(p.relative_to(prepared_dir)): p.read_bytes() for p in sorted(prepared_dir.glob('shards/*/*.array_record'))}
  out['shards'] = json.dumps(json.loads((prepared_dir / prepared.MANIFEST).read_text())['shards']).encode()
  return out


def _reference_stream(tokenizer, raw: pathlib.Path, names: list[str]) -> np.ndarray:
  ids = []
  for name in names:
    path = raw / name
    if name.endswith('.gz'):
      path = raw / (name + '.txt')
      path.write_bytes(gzip.decompress((raw / name).read_bytes()))
    for line in text.iter_lines(path):
      ids += tokenizer.encode(line) + [tokenizer.eos_id]
    if path != raw / name:
      path.unlink()
  return np.asarray(ids, np.int32)


def test_beam_with_two_workers_writes_the_same_bytes_as_one_worker_and_inline(corpus, tmp_path):
  dirs = {}
  for workers in (0, 1, 2):
    dirs[workers] = tmp_path / f'w{workers}'
    report = prepare.prepare(_data_settings(corpus), dirs[workers], dataclasses.replace(OPTIONS, workers=workers))
    assert report['shards_written'] == report['shards'] >= 10
  assert _records(dirs[0]) == _records(dirs[1]) == _records(dirs[2])
  data = grain_reader.load(dirs[2], _data_settings(corpus))
  expected = _reference_stream(data.tokenizer, corpus, ['train_a.txt', 'train_b.txt.gz'])
  stream = data.stream('train')
  np.testing.assert_array_equal(stream.read(0, len(stream)), expected)
  assert not stream.in_memory or len(stream) == len(expected)


def test_resume_redoes_only_the_missing_shards_and_gives_the_same_bytes(corpus, tmp_path):
  out = tmp_path / 'data'
  prepare.prepare(_data_settings(corpus), out, OPTIONS)
  first = _records(out)
  done = sorted((out / 'shards' / 'train').glob('*.json'))
  # A killed run: two shards never finished (one of them renamed its records but had no done marker yet),
  # one worker's temporary file is left behind.
  done[1].unlink()
  done[4].unlink()
  done[4].with_suffix('.array_record').unlink()
  (out / 'shards' / 'train' / (done[6].stem + '.array_record.tmp.999')).write_bytes(b'half')
  before = {p.name: p.stat().st_mtime_ns for p in (out / 'shards').glob('*/*.array_record')}
  report = prepare.prepare(_data_settings(corpus), out, OPTIONS)
  assert (report['shards_written'], report['shards_reused']) == (2, report['shards'] - 2)
  after = {p.name: p.stat().st_mtime_ns for p in (out / 'shards').glob('*/*.array_record')}
  redone = {name for name in after if before.get(name) != after[name]}
  assert redone == {done[1].stem + '.array_record', done[4].stem + '.array_record'}
  assert _records(out) == first
  assert not list(out.glob('shards/*/*.tmp.*'))


def test_changed_input_or_tokenizer_never_reuses_stale_shards(corpus, tmp_path):
  out = tmp_path / 'data'
  prepare.prepare(_data_settings(corpus), out, OPTIONS)
  names = lambda: {p.name for p in out.glob('shards/*/*.array_record')}
  old = names()
  with open(corpus / 'valid.txt', 'a') as f:
    f.write('a new last line\n')
  report = prepare.prepare(_data_settings(corpus), out, OPTIONS)
  new = names()
  valid_shards = {n for n in old if n.startswith('valid-')}
  assert len(valid_shards) > 1 and old - new == valid_shards  # Every shard of the changed file is redone ...
  assert len(new - old) == report['shards_written'] == len(valid_shards)  # ... and the stale ones are deleted.
  assert all(n.startswith('valid-') for n in new - old)
  data = grain_reader.load(out, _data_settings(corpus))
  stream = data.stream('valid')
  assert data.tokenizer.decode(stream.read(len(stream) - 5, len(stream))) == 'a new last line <eos>'
  report = prepare.prepare(_data_settings(corpus, 'sentencepiece'), out, OPTIONS)
  assert report['shards_reused'] == 0 and not names() & new
  assert tokenizers.load_tokenizer(out / 'tokenizer').kind == 'sentencepiece'
  with pytest.raises(prepared.PreparedDataMismatchError, match="data.tokenizer='word' but they were prepared"):
    grain_reader.load(out, _data_settings(corpus, 'word'))
  (corpus / 'test.txt').write_text('changed\n')
  with pytest.raises(prepared.PreparedDataMismatchError, match='input files changed'):
    grain_reader.load(out, _data_settings(corpus, 'sentencepiece'))


def test_a_worker_holds_one_batch_of_lines_not_its_shard(corpus, tmp_path):
  out = tmp_path / 'data'
  prepare.prepare(_data_settings(corpus), out, OPTIONS)
  stats = {p.name: json.loads(p.read_text()) for p in out.glob('shards/train/*.json')}
  biggest = max(stats.values(), key=lambda s: s['num_lines'])
  assert biggest['num_lines'] == 900  # The .gz file: one shard, ten times the others.
  assert all(s['num_lines'] < 150 for s in stats.values() if s is not biggest)
  assert max(s['max_lines_held'] for s in stats.values()) == OPTIONS.batch_lines


@pytest.mark.parametrize('tokenizer', ['word', 'sentencepiece'])  # sentencepiece reads the lines from C++
def test_a_bad_file_stops_naming_file_and_line_or_is_skipped_and_counted(corpus, tmp_path, tokenizer):
  bad = corpus / 'train_c.txt'
  bad.write_bytes(b'fine line\n' * 30 + b'caf\xe9 au lait\n' + b'more\n' * 5)
  with pytest.raises(text.BadCorpusError) as error:
    prepare.prepare(_data_settings(corpus, tokenizer), tmp_path / 'a', OPTIONS)
  assert str(error.value).startswith(f'{bad}, line 31: byte 0xe9 at column 4 is not UTF-8')
  assert not (tmp_path / 'a' / prepared.MANIFEST).exists()
  report = prepare.prepare(_data_settings(corpus, tokenizer), tmp_path / 'b',
                           dataclasses.replace(OPTIONS, skip_bad_files=True))
  assert [f['path'] for f in report['skipped_files']] == [str(bad)]
  bad.unlink()
  clean = prepare.prepare(_data_settings(corpus, tokenizer), tmp_path / 'c', OPTIONS)
  assert clean['tokens'] == report['tokens']


def test_an_empty_split_is_one_line(corpus, tmp_path):
  (corpus / 'test.txt').write_text('\n  \n\r\n')
  with pytest.raises(text.BadCorpusError) as error:
    prepare.prepare(_data_settings(corpus), tmp_path / 'data', OPTIONS)
  assert str(error.value) == f'The test split has no text (inputs: {corpus / "test.txt"}).'


@pytest.mark.slow
def test_kill_9_mid_preparation_then_rerun_redoes_only_unfinished_shards(ptb_dir, tmp_path):
  """The command itself, killed with SIGKILL after some shards are done, then run again."""
  command = [sys.executable, '-m', 'stablemoe_jax.prepare', '--config', 'configs/default.py',
             f'--config.data.data_dir={ptb_dir}', '--workers=0', '--shard_mb=0.05', '--batch_lines=20']
  env = dict(os.environ, PYTHONPATH=str(REPO))
  reference = tmp_path / 'reference'
  subprocess.run(command + [f'--workdir={reference}'], cwd=REPO, env=env, check=True, capture_output=True)
  workdir = tmp_path / 'killed'
  process = subprocess.Popen(command + [f'--workdir={workdir}'], cwd=REPO, env=env, stderr=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL)
  train = workdir / 'data' / 'shards' / 'train'
  while len(list(train.glob('*.json'))) < 10 and process.poll() is None:
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  finished = {p.stem: p.stat().st_mtime_ns for p in train.glob('*.json')}
  total = len(list((reference / 'data' / 'shards' / 'train').glob('*.json')))
  assert 10 <= len(finished) < total and not (workdir / 'data' / prepared.MANIFEST).exists()
  run = subprocess.run(command + [f'--workdir={workdir}'], cwd=REPO, env=env, check=True, capture_output=True,
                       text=True)
  report = json.loads(run.stdout.strip().splitlines()[-1])
  assert report['shards_reused'] == len(finished)
  assert all(p.stat().st_mtime_ns == finished[p.stem] for p in train.glob('*.json') if p.stem in finished)
  assert _records(workdir / 'data') == _records(reference / 'data')


def test_the_tokenizer_is_built_from_tokenizer_files_when_given(corpus, tmp_path):
  prepare.prepare(_data_settings(corpus, tokenizer_files=f'{corpus}/train_a.txt'), tmp_path / 'data', OPTIONS)
  expected = tokenizers.WordTokenizer.from_file(corpus / 'train_a.txt')
  assert tokenizers.load_tokenizer(tmp_path / 'data' / 'tokenizer').fingerprint() == expected.fingerprint()

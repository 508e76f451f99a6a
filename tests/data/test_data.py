"""Tests of stablemoe_jax.data on the real corpora (PTB, botchan) in shared/data.

The corpora are found at $STABLEMOE_DATA_DIR or ../shared/data beside the
repository. PTB is tokenized and written to TFDS records once per session.

One file over ~400 lines on purpose: every section (tokenizers, the builder, streams and blocks, locating data,
prepared data without the raw corpus, bad own corpora) reads the ``ptb`` fixture, this module's one tokenization of
PTB into TFDS records; a second module would tokenize PTB again.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil

import ml_collections
import numpy as np
import pytest

from stablemoe_jax.data import download
from stablemoe_jax.data.common import locate
from stablemoe_jax.data.common import text
from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.lm import blocks
from stablemoe_jax.data.lm import builder
from stablemoe_jax.data.lm import pipeline
from stablemoe_jax.data.lm import pipeline as data_lib
from stablemoe_jax.data.lm import stream

SEQ_LEN = 35
BATCH = 8


@pytest.fixture(scope='session')
def shared_data(ptb_dir) -> pathlib.Path:
  """The shared corpora folder (conftest.py finds it, or fails saying how to point at it)."""
  return ptb_dir


@pytest.fixture(scope='session')
def ptb_files(shared_data) -> dict[str, pathlib.Path]:
  return locate.corpus_files(shared_data, 'ptb')


def _data_config(data_dir, corpus='ptb', tokenizer='word', sp_vocab=500):
  return ml_collections.ConfigDict(
      dict(corpus=corpus, data_dir=str(data_dir), tokenizer=tokenizer, sentencepiece_vocab_size=sp_vocab)
  )


@pytest.fixture(scope='session')
def prepared_dir(tmp_path_factory) -> pathlib.Path:
  return tmp_path_factory.mktemp('prepared')


@pytest.fixture(scope='session')
def ptb(shared_data, prepared_dir) -> data_lib.LMData:
  return data_lib.load_lm_data(_data_config(shared_data), prepared_dir)


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


# --- tokenizers ---------------------------------------------------------------


def test_ptb_word_vocabulary_is_the_standard_10k(ptb, ptb_files):
  tok = ptb.tokenizer
  assert isinstance(tok, tokenizers.WordTokenizer)
  assert tok.vocab_size == ptb.vocab_size == 10000
  assert tok.eos_id == 0 and tok.id_to_token(0) == '<eos>'
  assert tok.id_to_token(1) == 'the'  # Most frequent train word.
  unk = tok.token_to_id('<unk>')
  assert tok.encode('the zyzzyva-never-seen') == [1, unk]
  # Valid and test have no word outside the train vocabulary.
  for split in ('valid', 'test'):
    words = {w for line in text.iter_lines(ptb_files[split]) for w in line.split()}
    assert all(tok.token_to_id(w) >= 0 for w in words)


def test_word_vocabulary_order_is_deterministic():
  tok = tokenizers.WordTokenizer.from_lines(['b a c a', 'c b a d'])
  assert [tok.id_to_token(i) for i in range(tok.vocab_size)] == ['<eos>', 'a', 'b', 'c', 'd']
  with pytest.raises(ValueError, match='not in the vocabulary'):
    tok.encode('a e')  # No <unk> in this vocabulary.


def test_word_round_trip_of_a_real_line(ptb, ptb_files):
  line = next(text.iter_lines(ptb_files['valid']))
  ids = ptb.tokenizer.encode(line)
  assert ptb.tokenizer.eos_id not in ids
  assert ptb.tokenizer.decode(ids) == ' '.join(line.split())


def test_word_tokenizer_saves_and_reloads(ptb, prepared_dir, ptb_files):
  again = tokenizers.build_tokenizer('word', ptb_files['train'], prepared_dir / 'tokenizer')
  assert again.fingerprint() == ptb.tokenizer.fingerprint()
  loaded = tokenizers.load_tokenizer(prepared_dir / 'tokenizer')
  assert loaded.fingerprint() == ptb.tokenizer.fingerprint()
  vocab = (prepared_dir / 'tokenizer' / 'vocab.txt').read_text().splitlines()
  assert len(vocab) == 10000 and vocab[0] == '<eos>'
  with pytest.raises(ValueError, match='built differently'):
    tokenizers.build_tokenizer('sentencepiece', ptb_files['train'], prepared_dir / 'tokenizer', 500)


def test_sentencepiece_trains_deterministically_and_round_trips(shared_data, tmp_path):
  botchan = shared_data / 'botchan' / 'botchan.txt'
  a = tokenizers.build_tokenizer('sentencepiece', botchan, tmp_path / 'a', vocab_size=500)
  b = tokenizers.SentencePieceTokenizer.from_file(botchan, 500)
  assert a.fingerprint() == b.fingerprint()  # Same model bytes.
  assert a.vocab_size == 500 and a.id_to_token(a.eos_id) == '</s>'
  lines = list(text.iter_lines(botchan))
  assert not any('\r' in line or '\ufeff' in line for line in lines)
  for line in lines:
    ids = a.encode(line)
    assert a.eos_id not in ids
    assert a.decode(ids) == ' '.join(line.split())
  # Reloaded from disk: same model; a different vocab size is refused.
  reloaded = tokenizers.build_tokenizer('sentencepiece', botchan, tmp_path / 'a', vocab_size=500)
  assert reloaded.fingerprint() == a.fingerprint()
  with pytest.raises(ValueError, match='built differently'):
    tokenizers.build_tokenizer('sentencepiece', botchan, tmp_path / 'a', vocab_size=600)


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


# --- token stream and blocks ---------------------------------------------------


def test_stream_matches_text_in_and_out_of_memory(ptb, valid_stream_ref):
  in_mem = ptb.stream('valid')
  assert in_mem.in_memory
  np.testing.assert_array_equal(in_mem.read(0, len(in_mem)), valid_stream_ref)
  lazy = stream.TokenStream(ptb.sources['valid'], in_memory=False)
  assert not lazy.in_memory and len(lazy) == len(valid_stream_ref)
  np.testing.assert_array_equal(lazy.offsets, in_mem.offsets)
  rng = np.random.default_rng(0)
  for _ in range(50):
    start = int(rng.integers(0, len(lazy)))
    stop = min(len(lazy), start + int(rng.integers(0, 200)))
    np.testing.assert_array_equal(lazy.read(start, stop), valid_stream_ref[start:stop])
  np.testing.assert_array_equal(lazy.read(len(lazy) - 5, len(lazy)), valid_stream_ref[-5:])
  with pytest.raises(IndexError):
    lazy.read(0, len(lazy) + 1)


def test_a_split_read_once_is_saved_flat_and_loaded_back_equal(ptb, shared_data, prepared_dir, valid_stream_ref,
                                                                tmp_path):
  """The first `stream` of a split writes SPLIT.stream.npz beside its TFDS records; a later load reads that file
  (no record parsed) and gives the same ids and line offsets as the text. Where the file cannot be written, the
  records read are used as they are."""
  ptb.stream('valid')
  cache = ptb.stream_cache_dir / 'valid.stream.npz'
  assert cache.is_file() and cache.parent == prepared_dir / 'tfds' / 'lm_corpus' / cache.parent.parent.name / '1.0.0'
  again = data_lib.load_lm_data(_data_config(shared_data), prepared_dir)
  loaded = again.stream('valid')
  assert isinstance(loaded._records, stream.FlatRecords)
  np.testing.assert_array_equal(loaded.read(0, len(loaded)), valid_stream_ref)
  np.testing.assert_array_equal(loaded.offsets, stream.TokenStream(ptb.sources['valid'], in_memory=False).offsets)
  np.testing.assert_array_equal(loaded._records[5], valid_stream_ref[loaded.offsets[5]:loaded.offsets[6]])

  nowhere = tmp_path / 'missing' / 'test.stream.npz'  # a folder that cannot be written (even by root)
  fallback = stream.cached_records(ptb.sources['test'], nowhere)
  assert not nowhere.parent.exists() and isinstance(fallback, stream.FlatRecords)
  np.testing.assert_array_equal(stream.TokenStream(fallback).read(0, 100), ptb.stream('test').read(0, 100))


def test_train_blocks_overlap_by_one_and_tile_the_stream(ptb, valid_stream_ref):
  src = blocks.TrainBlocks(ptb.stream('valid'), SEQ_LEN)
  assert len(src) == (len(valid_stream_ref) - 1) // SEQ_LEN
  for i in [0, 1, 2, len(src) // 2, len(src) - 1]:
    ex = src[i]
    assert ex['inputs'].shape == ex['targets'].shape == ex['weights'].shape == (SEQ_LEN,)
    np.testing.assert_array_equal(ex['inputs'][1:], ex['targets'][:-1])
    start = i * SEQ_LEN
    np.testing.assert_array_equal(ex['inputs'], valid_stream_ref[start : start + SEQ_LEN])
    np.testing.assert_array_equal(ex['targets'], valid_stream_ref[start + 1 : start + SEQ_LEN + 1])
  # Consecutive blocks share one token: the last target of i is the first input of i + 1.
  assert src[3]['targets'][-1] == src[4]['inputs'][0]


def _rows(batch_list, key='inputs'):
  return [row.tobytes() for b in batch_list for row in b[key]]


def test_train_epochs_are_permutations_of_the_blocks_reshuffled_each_epoch(ptb, valid_stream_ref):
  batch = 7
  valid = ptb.stream('valid')
  num_blocks = (len(valid) - 1) // SEQ_LEN
  assert num_blocks % batch == 0  # 2107 = 7 * 301, so epochs align with batches.
  ds = pipeline.train_dataset(valid, batch, SEQ_LEN, seed=3)
  per_epoch = num_blocks // batch
  epoch0 = [ds[i] for i in range(per_epoch)]
  epoch1 = [ds[i] for i in range(per_epoch, 2 * per_epoch)]
  reference = [valid_stream_ref[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN].tobytes() for i in range(num_blocks)]
  assert sorted(_rows(epoch0)) == sorted(reference)
  assert sorted(_rows(epoch1)) == sorted(reference)
  assert _rows(epoch0) != _rows(epoch1)
  assert _rows(epoch0) != reference  # Shuffled.
  for b in epoch0[:3]:
    np.testing.assert_array_equal(b['inputs'][:, 1:], b['targets'][:, :-1])
    assert b['weights'].dtype == np.float32 and np.all(b['weights'] == 1)
  other_seed = pipeline.train_dataset(valid, batch, SEQ_LEN, seed=4)
  assert _rows([other_seed[0]]) != _rows(epoch0[:1])


def test_train_iterator_resumes_exactly_from_state(ptb):
  it = ptb.train_iterator(BATCH, SEQ_LEN, seed=0)
  first = next(it)
  assert first['inputs'].shape == (BATCH, SEQ_LEN) and first['inputs'].dtype == np.int32
  assert first['targets'].dtype == np.int32 and first['weights'].dtype == np.float32
  for _ in range(4):
    next(it)
  state = it.get_state()
  json.dumps(state)  # Checkpointable as JSON.
  expected = [next(it) for _ in range(6)]
  fresh = ptb.train_iterator(BATCH, SEQ_LEN, seed=0)
  fresh.set_state(state)
  resumed = [next(fresh) for _ in range(6)]
  for a, b in zip(expected, resumed):
    for key in ('inputs', 'targets', 'weights'):
      np.testing.assert_array_equal(a[key], b[key])
  # Same seed, fresh start: the same first batch.
  np.testing.assert_array_equal(next(ptb.train_iterator(BATCH, SEQ_LEN, seed=0))['inputs'], first['inputs'])


def test_shards_are_disjoint_slices_of_the_global_batch(ptb):
  global_it = ptb.train_iterator(BATCH, SEQ_LEN, seed=1)
  shards = [ptb.train_iterator(BATCH, SEQ_LEN, seed=1, shard_index=k, shard_count=4) for k in range(4)]
  for _ in range(3):
    g = next(global_it)
    parts = [next(s) for s in shards]
    assert parts[0]['inputs'].shape == (BATCH // 4, SEQ_LEN)
    for key in ('inputs', 'targets'):
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), g[key])
  with pytest.raises(ValueError, match='multiple of shard_count'):
    ptb.train_iterator(10, SEQ_LEN, seed=1, shard_index=0, shard_count=4)


def test_eval_batches_cover_every_target_once_in_order(ptb, valid_stream_ref):
  batches = list(ptb.eval_batches('valid', BATCH, SEQ_LEN))
  n = len(valid_stream_ref)
  assert ptb.split_num_tokens('valid') == n
  num_rows = math.ceil((n - 1) / SEQ_LEN)
  assert len(batches) == math.ceil(num_rows / BATCH)
  for b in batches:
    assert b['inputs'].shape == b['targets'].shape == b['weights'].shape == (BATCH, SEQ_LEN)
    assert b['inputs'].dtype == np.int32 and b['weights'].dtype == np.float32
  weights = np.concatenate([b['weights'].reshape(-1) for b in batches])
  assert weights.sum() == n - 1
  mask = weights > 0
  # Real tokens come first, padding only at the end.
  assert mask[: n - 1].all() and not mask[n - 1 :].any()
  inputs = np.concatenate([b['inputs'].reshape(-1) for b in batches])
  targets = np.concatenate([b['targets'].reshape(-1) for b in batches])
  np.testing.assert_array_equal(inputs[mask], valid_stream_ref[:-1])
  np.testing.assert_array_equal(targets[mask], valid_stream_ref[1:])
  assert not inputs[~mask].any() and not targets[~mask].any()  # Pad id 0.
  again = list(ptb.eval_batches('valid', BATCH, SEQ_LEN))
  for a, b in zip(batches, again):
    np.testing.assert_array_equal(a['targets'], b['targets'])


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
    data_lib.load_lm_data(_data_config(tmp_path / 'nowhere'), tmp_path / 'prep')


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
    data_lib.load_lm_data(_data_config(shared_data, corpus='wiki'), tmp_path)
  with pytest.raises(ValueError, match='word, sentencepiece'):
    data_lib.load_lm_data(_data_config(shared_data, tokenizer='bpe'), tmp_path)


def test_text_corpus_with_sentencepiece_end_to_end(shared_data, tmp_path):
  """A user's own corpus: DIR/{train,valid,test}.txt, here cut from botchan (CRLF)."""
  raw = (shared_data / 'botchan' / 'botchan.txt').read_bytes().split(b'\r\n')
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'train.txt').write_bytes(b'\r\n'.join(raw[:3000]))
  (corpus / 'valid.txt').write_bytes(b'\r\n'.join(raw[3000:3600]))
  (corpus / 'test.txt').write_bytes(b'\r\n'.join(raw[3600:]))
  lm = data_lib.load_lm_data(_data_config(corpus, corpus='text', tokenizer='sentencepiece'), tmp_path / 'prep')
  assert lm.vocab_size == 500 and isinstance(lm.tokenizer, tokenizers.SentencePieceTokenizer)
  ref = _reference_stream(lm.tokenizer, corpus / 'valid.txt')
  assert lm.split_num_tokens('valid') == len(ref)
  got = np.concatenate([b['targets'][b['weights'] > 0] for b in lm.eval_batches('valid', 4, 64)])
  np.testing.assert_array_equal(got, ref[1:])
  batch = next(lm.train_iterator(4, 64, seed=0))
  assert batch['inputs'].shape == (4, 64) and batch['inputs'].max() < 500
  config_dirs = list((tmp_path / 'prep' / 'tfds' / 'lm_corpus').iterdir())
  assert [d.name.split('-')[:2] for d in config_dirs] == [['text', 'sentencepiece']]


# --- download (no network) -----------------------------------------------------


def test_download_md5s_match_shared_md5sums(shared_data):
  sums = {}
  for line in (shared_data / 'MD5SUMS').read_text().splitlines():
    md5, name = line.split()
    sums[name] = md5
  for split, md5 in download.PTB_MD5.items():
    assert sums[f'./ptb/ptb.{split}.txt'] == md5


def test_download_verifies_checksums_without_network(ptb_files, tmp_path, monkeypatch):
  fetched = []

  def local_fetch(url, dest):
    split = url.rsplit('ptb.', 1)[1].split('.')[0]
    fetched.append(split)
    shutil.copyfile(ptb_files[split], dest)

  monkeypatch.setattr(download, 'fetch', local_fetch)
  paths = download.download_ptb(tmp_path)
  assert sorted(fetched) == ['test', 'train', 'valid']
  assert paths == {s: tmp_path / 'ptb' / f'ptb.{s}.txt' for s in ('train', 'valid', 'test')}
  assert locate.corpus_files(tmp_path, 'ptb') == paths
  fetched.clear()
  download.download_ptb(tmp_path)  # Verified files are not fetched again.
  assert fetched == []

  def corrupt_fetch(url, dest):
    local_fetch(url, dest)
    with open(dest, 'ab') as f:
      f.write(b'corrupted')

  monkeypatch.setattr(download, 'fetch', corrupt_fetch)
  bad = tmp_path / 'bad'
  with pytest.raises(download.ChecksumError, match='md5'):
    download.download_ptb(bad)
  assert list((bad / 'ptb').iterdir()) == []  # Nothing left behind.


def test_download_without_network_is_one_line_and_nonzero(tmp_path, monkeypatch, capsys):
  def offline(url, timeout=None):
    raise download.urllib.error.URLError(OSError(-2, 'Name or service not known'))

  monkeypatch.setattr(download.urllib.request, 'urlopen', offline)
  assert download.main(['--dest', str(tmp_path)]) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1
  assert err.startswith('error: could not download https://') and 'ptb.train.txt' in err
  assert 'Name or service not known' in err
  assert list((tmp_path / 'ptb').iterdir()) == []  # No .part file left.


# --- prepared data without the raw corpus ---------------------------------------


def _eval_targets(lm, split):
  return np.concatenate([b['targets'][b['weights'] > 0] for b in lm.eval_batches(split, 16, 64)])


def test_prepared_data_serves_a_run_without_the_raw_corpus(ptb, prepared_dir, valid_stream_ref, tmp_path,
                                                           monkeypatch):
  monkeypatch.delenv(locate.ENV_VAR, raising=False)
  for configured in ('', str(tmp_path / 'nowhere')):
    lm = data_lib.load_lm_data(_data_config(configured), prepared_dir)
    assert lm.tokenizer.fingerprint() == ptb.tokenizer.fingerprint() and lm.vocab_size == 10000
    np.testing.assert_array_equal(_eval_targets(lm, 'valid'), valid_stream_ref[1:])
  assert len(lm.sources['train']) == len(ptb.sources['train'])  # same records (lines) in the train split
  with pytest.raises(locate.DataNotFoundError):  # Nothing prepared there: the raw corpus is needed.
    data_lib.load_lm_data(_data_config(''), tmp_path / 'empty')


def test_prepared_data_of_another_config_is_refused(ptb, prepared_dir, tmp_path, monkeypatch):
  monkeypatch.delenv(locate.ENV_VAR, raising=False)
  for config, named in ((_data_config('', tokenizer='sentencepiece'), "data.tokenizer='sentencepiece'"),
                        (_data_config('', corpus='text'), "data.corpus='text'")):
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
    data_lib.load_lm_data(_data_config(''), copy)


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
    data_lib.load_lm_data(_data_config(corpus, corpus='text'), tmp_path / 'prep')
  assert str(err.value) == (f'{corpus / "train.txt"}: the train split is empty (no line with text); '
                            'put one sentence or segment per line in it.')
  assert not (tmp_path / 'prep').exists()


def test_latin1_file_names_file_line_and_byte_and_writes_nothing(ptb_files, tmp_path):
  good = b'\n'.join(_ptb_lines(ptb_files, 'valid', 20)) + b'\n'
  bad = good + 'un caf\xe9 cr\xe8me\n'.encode('latin-1')  # line 21
  corpus = _write_corpus(tmp_path / 'corpus', {'train': good, 'valid': good, 'test': bad})
  with pytest.raises(text.BadCorpusError) as err:
    data_lib.load_lm_data(_data_config(corpus, corpus='text'), tmp_path / 'prep')
  message = str(err.value)
  assert message.startswith(f'{corpus / "test.txt"}, line 21: byte 0xe9 at column 7 is not UTF-8')
  assert 'iconv -f latin1 -t utf-8' in message and '\n' not in message
  assert not (tmp_path / 'prep').exists()
  # Fixed in place (converted to UTF-8): the same prepared directory now builds.
  (corpus / 'test.txt').write_bytes(bad.decode('latin-1').encode('utf-8'))
  lm = data_lib.load_lm_data(_data_config(corpus, corpus='text'), tmp_path / 'prep')
  assert lm.split_num_tokens('test') == lm.split_num_tokens('valid') + 4  # 3 words + eos


def test_crlf_and_missing_final_newline_give_the_same_tokens_as_lf(ptb_files, tmp_path):
  lines = {s: _ptb_lines(ptb_files, s, n) for s, n in (('train', 400), ('valid', 60), ('test', 60))}
  lf = _write_corpus(tmp_path / 'lf', {s: b'\n'.join(l) + b'\n' for s, l in lines.items()})
  crlf = _write_corpus(tmp_path / 'crlf', {s: b'\r\n'.join(l).rstrip(b'\r\n') for s, l in lines.items()})
  assert b'\r\n' in (crlf / 'train.txt').read_bytes() and not (crlf / 'train.txt').read_bytes().endswith(b'\n')
  a = data_lib.load_lm_data(_data_config(lf, corpus='text'), tmp_path / 'prep_lf')
  b = data_lib.load_lm_data(_data_config(crlf, corpus='text'), tmp_path / 'prep_crlf')
  assert a.tokenizer.fingerprint() == b.tokenizer.fingerprint()
  for split in ('valid', 'test'):
    np.testing.assert_array_equal(_eval_targets(a, split), _eval_targets(b, split))
  assert a.split_num_tokens('train') == b.split_num_tokens('train')
  batch_a, batch_b = next(a.train_iterator(4, 16, seed=0)), next(b.train_iterator(4, 16, seed=0))
  np.testing.assert_array_equal(batch_a['inputs'], batch_b['inputs'])

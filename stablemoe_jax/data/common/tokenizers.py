"""Tokenizers: text line -> token ids, built from the TRAIN split only.

`encode(line)` returns the ids of one sentence WITHOUT end-of-sentence; the
caller (the TFDS builder) appends `eos_id` to every line.

Two implementations share the `Tokenizer` protocol:

* `WordTokenizer`: every whitespace token of the train split plus `<eos>`.
  Ids: `<eos>` = 0, then words by descending train frequency, ties broken
  alphabetically (deterministic). Unknown words map to `<unk>` if the
  vocabulary has it, else encoding raises. For PTB this is the standard
  10,000-word vocabulary (9,999 types including `<unk>`, plus `<eos>`).
  Saved as `vocab.txt`, one token per line, line number = id.
* `SentencePieceTokenizer`: a sentencepiece model (unigram by default)
  trained on the train split's lines (CRLF and BOM normalised, empty lines
  dropped) with deterministic options (all sentences, no input shuffling, one
  thread). Ids: `<unk>` = 0, `</s>` (eos) = 1, no bos/pad. Saved as
  `spm.model`.

A saved tokenizer directory also holds `tokenizer.json` ({kind, vocab_size,
train_md5}); `build_tokenizer` reuses a saved tokenizer so a resumed run
encodes exactly as before, and refuses one built differently.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import pathlib
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import sentencepiece as spm

from stablemoe_jax.data.common import text
from stablemoe_jax.data.common.locate import DataError

EOS = '<eos>'
UNK = '<unk>'
META_FILE = 'tokenizer.json'
TOKENIZER_KINDS = ('word', 'sentencepiece')


@runtime_checkable
class Tokenizer(Protocol):
  """What the data pipeline needs from a tokenizer."""

  kind: str

  @property
  def vocab_size(self) -> int:
    """Number of ids; every id is in [0, vocab_size)."""

  @property
  def eos_id(self) -> int:
    """Id appended after every line."""

  def encode(self, line: str) -> list[int]:
    """Ids of one line, without eos."""

  def decode(self, ids: Iterable[int]) -> str:
    """Text of a sequence of ids."""

  def id_to_token(self, i: int) -> str:
    """The vocabulary entry for id `i`."""

  def fingerprint(self) -> str:
    """Hex digest identifying the vocabulary / model exactly."""

  def save(self, directory: os.PathLike | str) -> None:
    """Writes the tokenizer's files into `directory` (see `load_tokenizer`)."""


class WordTokenizer:
  """Word-level vocabulary: whitespace tokens of the train split plus `<eos>`."""

  kind = 'word'
  VOCAB_FILE = 'vocab.txt'

  def __init__(self, tokens: Sequence[str]):
    """`tokens[i]` is the token with id i; `tokens[0]` must be `<eos>`."""
    tokens = list(tokens)
    if not tokens or tokens[0] != EOS:
      raise ValueError(f'A word vocabulary must start with {EOS!r}.')
    self._tokens = tokens
    self._ids = {t: i for i, t in enumerate(tokens)}
    if len(self._ids) != len(tokens):
      raise ValueError('Duplicate tokens in the word vocabulary.')
    if any(not t or t != t.strip() or len(t.split()) != 1 for t in tokens):
      raise ValueError('Word vocabulary entries must be non-empty and contain no whitespace.')
    self._unk_id = self._ids.get(UNK)

  @classmethod
  def from_lines(cls, lines: Iterable[str]) -> WordTokenizer:
    """Builds the vocabulary: `<eos>`, then words by (-count, word)."""
    counts = collections.Counter()
    for line in lines:
      counts.update(line.split())
    counts.pop(EOS, None)
    words = sorted(counts, key=lambda w: (-counts[w], w))
    return cls([EOS] + words)

  @classmethod
  def from_file(cls, train_file: os.PathLike | str) -> WordTokenizer:
    return cls.from_lines(text.iter_lines(train_file))

  @property
  def vocab_size(self) -> int:
    return len(self._tokens)

  @property
  def eos_id(self) -> int:
    return 0

  @property
  def unk_id(self) -> int | None:
    return self._unk_id

  def encode(self, line: str) -> list[int]:
    ids = self._ids
    unk = self._unk_id
    if unk is not None:
      return [ids.get(w, unk) for w in line.split()]
    try:
      return [ids[w] for w in line.split()]
    except KeyError as e:
      raise ValueError(
          f'Word {e.args[0]!r} is not in the vocabulary, which has no {UNK!r} '
          'token to map unknown words to.'
      ) from None

  def decode(self, ids: Iterable[int]) -> str:
    return ' '.join(self._tokens[int(i)] for i in ids)

  def id_to_token(self, i: int) -> str:
    return self._tokens[int(i)]

  def token_to_id(self, token: str) -> int:
    return self._ids[token]

  def fingerprint(self) -> str:
    return hashlib.md5(self._vocab_text().encode('utf-8')).hexdigest()

  def _vocab_text(self) -> str:
    return ''.join(t + '\n' for t in self._tokens)

  def save(self, directory: os.PathLike | str) -> None:
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / self.VOCAB_FILE).write_text(self._vocab_text(), encoding='utf-8')

  @classmethod
  def load(cls, directory: os.PathLike | str) -> WordTokenizer:
    path = pathlib.Path(directory) / cls.VOCAB_FILE
    return cls(path.read_text(encoding='utf-8').splitlines())


class SentencePieceTokenizer:
  """A sentencepiece model; `</s>` is the eos id."""

  kind = 'sentencepiece'
  MODEL_FILE = 'spm.model'

  def __init__(self, model_proto: bytes):
    self._model_proto = bytes(model_proto)
    self._sp = spm.SentencePieceProcessor(model_proto=self._model_proto)
    if self._sp.eos_id() < 0:
      raise ValueError('The sentencepiece model has no eos piece.')

  @classmethod
  def train(
      cls,
      lines: Iterable[str],
      vocab_size: int,
      model_type: str = 'unigram',
      character_coverage: float = 1.0,
      num_threads: int = 1,
  ) -> SentencePieceTokenizer:
    """Trains on `lines` (already normalised) deterministically.

    Every sentence is used (input_sentence_size=0) in the given order
    (shuffle_input_sentence=False); one thread keeps the EM sums in a fixed
    order. Ids: unk 0, eos 1, no bos/pad.
    """
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=writer,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=num_threads,
        unk_id=0,
        eos_id=1,
        bos_id=-1,
        pad_id=-1,
        minloglevel=2,
    )
    return cls(writer.getvalue())

  @classmethod
  def from_file(cls, train_file: os.PathLike | str, vocab_size: int, **kwargs) -> SentencePieceTokenizer:
    return cls.train(text.iter_lines(train_file), vocab_size, **kwargs)

  @property
  def vocab_size(self) -> int:
    return self._sp.vocab_size()

  @property
  def eos_id(self) -> int:
    return self._sp.eos_id()

  def encode(self, line: str) -> list[int]:
    return self._sp.encode(line.replace('\r', '').strip())

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  def id_to_token(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def fingerprint(self) -> str:
    return hashlib.md5(self._model_proto).hexdigest()

  def save(self, directory: os.PathLike | str) -> None:
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / self.MODEL_FILE).write_bytes(self._model_proto)

  @classmethod
  def load(cls, directory: os.PathLike | str) -> SentencePieceTokenizer:
    return cls((pathlib.Path(directory) / cls.MODEL_FILE).read_bytes())


_CLASSES = {'word': WordTokenizer, 'sentencepiece': SentencePieceTokenizer}


def _check_kind(kind: str) -> None:
  if kind not in _CLASSES:
    raise ValueError(f'Unknown tokenizer {kind!r}; allowed: {", ".join(TOKENIZER_KINDS)}.')


def load_tokenizer(directory: os.PathLike | str) -> Tokenizer:
  """Loads a tokenizer saved by `build_tokenizer` (reads tokenizer.json)."""
  meta = json.loads((pathlib.Path(directory) / META_FILE).read_text())
  _check_kind(meta['kind'])
  return _CLASSES[meta['kind']].load(directory)


def build_tokenizer(
    kind: str,
    train_file: os.PathLike | str,
    out_dir: os.PathLike | str,
    vocab_size: int | None = None,
) -> Tokenizer:
  """Loads the tokenizer saved in `out_dir`, or builds it from `train_file` and saves it.

  Args:
    kind: 'word' or 'sentencepiece'.
    train_file: the train split's text (the only text a tokenizer sees).
    out_dir: where the tokenizer lives (e.g. the run's workdir/data/tokenizer).
    vocab_size: sentencepiece vocabulary size (required for it); ignored for
      'word', whose vocabulary is every train word plus `<eos>`.

  Raises:
    ValueError: unknown kind or missing vocab_size.
    DataError: `out_dir` holds a tokenizer of another kind / vocab size /
      train file (use a fresh directory or delete it).
  """
  _check_kind(kind)
  if kind == 'sentencepiece' and not vocab_size:
    raise ValueError('A sentencepiece tokenizer needs a positive vocab_size.')
  out_dir = pathlib.Path(out_dir)
  meta_path = out_dir / META_FILE
  train_md5 = text.file_md5(train_file)
  wanted = {'kind': kind, 'train_md5': train_md5}
  if kind == 'sentencepiece':
    wanted['vocab_size'] = int(vocab_size)

  if meta_path.is_file():
    meta = json.loads(meta_path.read_text())
    stale = {k: (meta.get(k), v) for k, v in wanted.items() if meta.get(k) != v}
    if stale:
      raise DataError(
          f'{out_dir} holds a tokenizer built differently '
          f'(saved vs requested: {stale}). Use a new workdir or delete {out_dir}.'
      )
    tokenizer = _CLASSES[kind].load(out_dir)
    if tokenizer.vocab_size != meta['vocab_size']:
      raise ValueError(f'{out_dir}: tokenizer files do not match {META_FILE}.')
    return tokenizer

  if kind == 'word':
    tokenizer = WordTokenizer.from_file(train_file)
  else:
    tokenizer = SentencePieceTokenizer.from_file(train_file, int(vocab_size))
  tokenizer.save(out_dir)
  # Written last: a directory with tokenizer.json holds a complete tokenizer.
  meta = dict(wanted, vocab_size=tokenizer.vocab_size, train_file=str(train_file))
  tmp = meta_path.with_suffix('.json.tmp')
  tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + '\n')
  tmp.replace(meta_path)
  return tokenizer

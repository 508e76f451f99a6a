"""One sentencepiece model for every source language and English, with language tags as single pieces.

Ids (``core/constants.py``): pad 0, unk 1, bos 2 (starts the decoder input), eos 3 (ends source and
target), then the tags ``__de__``, ``__fr__``, ... (user-defined pieces, never split), then the learned pieces.
Trained deterministically (every sentence, in order, one thread) on the training sources and targets only,
and saved with the run as ``spm.model`` plus ``tokenizer.json`` (settings and the model's md5).
"""
from __future__ import annotations

import hashlib
import io
import json
import pathlib
from collections.abc import Iterable, Sequence

import sentencepiece as spm

from stablemoe_jax.data.common.locate import DataError
from stablemoe_jax.core.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401  (re-exported)

MODEL_FILE = "spm.model"
META_FILE = "tokenizer.json"


MAX_TAGS = 64  # language tags a model may have


def language_tag(language: str) -> str:
  """The source-language tag piece: "de" -> "__de__"."""
  return f"__{language}__"


def _is_tag(piece: str) -> bool:
  return len(piece) > 4 and piece.startswith("__") and piece.endswith("__")


class JointSentencePiece:
  """A joint sentencepiece model with pad/unk/bos/eos ids and language tags."""

  kind = "joint_sentencepiece"

  def __init__(self, model_proto: bytes):
    self._model_proto = bytes(model_proto)
    self._sp = spm.SentencePieceProcessor(model_proto=self._model_proto)
    ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
      raise ValueError(f"a joint sentencepiece model needs pad/unk/bos/eos ids {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}, "
                       f"got {ids}")
    # User-defined pieces follow the four special ids; the tags are the ones shaped __xx__.
    self._tag_ids = frozenset(i for i in range(EOS_ID + 1, min(self.vocab_size, EOS_ID + 1 + MAX_TAGS))
                              if _is_tag(self._sp.id_to_piece(i)))

  @classmethod
  def train(cls, lines: Iterable[str], vocab_size: int, languages: Sequence[str], sample_lines: int = 0
            ) -> JointSentencePiece:
    """Trains on ``lines`` (stripped, non-empty) with one tag per source language in ``languages``.

    ``sample_lines > 0``: on a seeded sample of at most that many lines (memory ~ the sample); 0: every line.
    """
    if sample_lines:
      spm.set_random_generator_seed(0)
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=writer, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, input_sentence_size=sample_lines, shuffle_input_sentence=bool(sample_lines), num_threads=1,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        user_defined_symbols=[language_tag(lang) for lang in languages], minloglevel=2)
    return cls(writer.getvalue())

  @property
  def vocab_size(self) -> int:
    return self._sp.vocab_size()

  pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

  def tag_id(self, language: str) -> int:
    """The id of ``language``'s tag; raises KeyError if the model has none."""
    i = self._sp.piece_to_id(language_tag(language))
    if i == UNK_ID:
      raise KeyError(language)
    return i

  def encode(self, line: str) -> list[int]:
    """Ids of one line (no tag, bos or eos)."""
    return self._sp.encode(line.strip())

  def decode(self, ids: Iterable[int]) -> str:
    """Detokenised text of ``ids`` (pad, bos, eos and language tags are dropped)."""
    return self._sp.decode([int(i) for i in ids if int(i) > EOS_ID and int(i) not in self._tag_ids])

  def id_to_token(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def fingerprint(self) -> str:
    return hashlib.md5(self._model_proto).hexdigest()

  def save(self, directory: pathlib.Path, settings: dict) -> None:
    """Writes ``spm.model``, then ``tokenizer.json`` (``settings`` + the md5) last: its presence means complete."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MODEL_FILE).write_bytes(self._model_proto)
    meta = dict(settings, kind=self.kind, vocab_size=self.vocab_size, md5=self.fingerprint())
    (directory / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

  @classmethod
  def load(cls, directory: pathlib.Path, settings: dict) -> JointSentencePiece | None:
    """The tokenizer saved in ``directory`` with ``settings``; None if there is none; DataError if it differs."""
    meta_path = directory / META_FILE
    if not meta_path.is_file():
      return None
    meta = json.loads(meta_path.read_text())
    stale = {k: (meta.get(k), v) for k, v in settings.items() if meta.get(k) != v}
    if stale:
      raise DataError(f"{directory} holds a tokenizer built with other settings (saved vs requested: {stale}). "
                      f"Use a new --workdir or delete {directory}.")
    tokenizer = cls((directory / MODEL_FILE).read_bytes())
    if tokenizer.fingerprint() != meta["md5"]:
      raise DataError(f"{directory / MODEL_FILE} does not match {meta_path}; delete {directory} to rebuild it.")
    return tokenizer

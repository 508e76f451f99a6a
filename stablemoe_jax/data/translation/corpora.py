"""The parallel corpora of X->English translation: which files make which pair's splits.

* Multi30k (``multi30k/``): German, French and Czech into English. ``train.*`` (29,000 lines), ``val.*`` and the
  test sets ``test_2016_flickr`` (de, fr, cs), ``test_2017_flickr`` and ``test_2017_mscoco`` (de, fr),
  ``test_2018_flickr`` (de, fr, cs).
* The Bible (``bible_es_en/``): Spanish into English, one verse a line, ``keys.txt`` naming each verse
  (``Book.chapter.verse``). Whole books are held out: ``data.bible_valid_books`` and ``data.bible_test_books``
  (no verse of them is trained on); every other verse is training data.

A pair's splits are named sets: ``train``, ``valid`` (Multi30k ``val`` / the Bible's valid books) and its
test sets (``test_2016_flickr``, ..., ``bible_test``). Lines keep their order; nothing is filtered here.
"""
from __future__ import annotations

import dataclasses
import pathlib

from stablemoe_jax.data.common import text
from stablemoe_jax.data.common.locate import DataNotFoundError

MULTI30K_LANGUAGES = ("de", "fr", "cs")
MULTI30K_TESTS = {"de": ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"),
                  "fr": ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"),
                  "cs": ("test_2016_flickr", "test_2018_flickr")}
BIBLE_LANGUAGE = "es"
PAIR_NAMES = tuple(f"{lang}-en" for lang in MULTI30K_LANGUAGES + (BIBLE_LANGUAGE,))
TARGET_LANGUAGE = "en"


@dataclasses.dataclass(frozen=True)
class ParallelSet:
  """One named set of one pair: aligned source and target lines."""

  pair: str
  name: str
  sources: tuple[str, ...]
  targets: tuple[str, ...]

  @property
  def source_language(self) -> str:
    return self.pair.split("-")[0]


def parse_pairs(pairs: str) -> tuple[str, ...]:
  """``"de-en,fr-en"`` -> ("de-en", "fr-en"); raises ValueError on an unknown pair."""
  names = tuple(p.strip() for p in pairs.split(",") if p.strip())
  unknown = [p for p in names if p not in PAIR_NAMES]
  if unknown or not names:
    raise ValueError(f"data.pairs={pairs!r}: unknown pair(s) {unknown}; choose from {', '.join(PAIR_NAMES)}.")
  return names


def parse_books(books: str) -> tuple[str, ...]:
  return tuple(b.strip() for b in books.split(",") if b.strip())


def _read(path: pathlib.Path) -> list[str]:
  if not path.is_file():
    raise DataNotFoundError(
        f"{path} is missing; point --config.data.data_dir (or $STABLEMOE_DATA_DIR) at the shared data folder "
        f"holding multi30k/ and bible_es_en/ (see docs/translation.md).")
  text.check_corpus_file(path, path.name)
  # A pair's files are aligned by "\n"-ended lines (as `prepare` cuts them, shards.plan_aligned): newline="\n"
  # keeps a lone "\r" inside its line instead of ending a line there (universal newlines would shift every
  # later line against the other file); strip() drops the "\r" of a CRLF.
  with path.open(encoding="utf-8-sig", newline="\n") as f:
    return [line.strip() for line in f]


def _aligned(pair: str, name: str, sources: list[str], targets: list[str], where: str) -> ParallelSet:
  if len(sources) != len(targets):
    raise DataNotFoundError(f"{where}: {len(sources)} source lines but {len(targets)} target lines; the files of "
                            f"a pair must be line-aligned.")
  return ParallelSet(pair, name, tuple(sources), tuple(targets))


def multi30k_files(language: str) -> dict[str, str]:
  """{set name: file stem} of ``language``-en in ``multi30k/`` (``STEM.{language}``, ``STEM.en``)."""
  return {"train": "train", "valid": "val", **{t: t for t in MULTI30K_TESTS[language]}}


def multi30k_sets(data_dir: pathlib.Path, language: str) -> dict[str, ParallelSet]:
  """{train, valid, test sets} of ``language``-en from ``data_dir/multi30k``."""
  root = data_dir / "multi30k"
  pair = f"{language}-{TARGET_LANGUAGE}"
  files = multi30k_files(language)
  return {name: _aligned(pair, name, _read(root / f"{stem}.{language}"), _read(root / f"{stem}.en"),
                         f"{root}/{stem}.{{{language},en}}")
          for name, stem in files.items()}


def bible_sets(data_dir: pathlib.Path, valid_books: tuple[str, ...], test_books: tuple[str, ...]
               ) -> dict[str, ParallelSet]:
  """{train, valid, bible_test} of es-en: the held-out books' verses, and every other verse for training."""
  root = data_dir / "bible_es_en"
  sources, targets, keys = _read(root / "bible.es"), _read(root / "bible.en"), _read(root / "keys.txt")
  if not len(sources) == len(targets) == len(keys):
    raise DataNotFoundError(f"{root}: bible.es, bible.en and keys.txt must have one line per verse.")
  books = [key.split(".")[0] for key in keys]
  known = set(books)
  for option, chosen in (("bible_valid_books", valid_books), ("bible_test_books", test_books)):
    missing = [b for b in chosen if b not in known]
    if missing:
      raise ValueError(f"data.{option}: unknown book(s) {missing}; keys.txt names {', '.join(dict.fromkeys(books))}.")
  overlap = set(valid_books) & set(test_books)
  if overlap:
    raise ValueError(f"data.bible_valid_books and data.bible_test_books share {sorted(overlap)}.")
  pair = f"{BIBLE_LANGUAGE}-{TARGET_LANGUAGE}"

  def select(keep) -> tuple[list[str], list[str]]:
    rows = [i for i, book in enumerate(books) if keep(book)]
    return [sources[i] for i in rows], [targets[i] for i in rows]

  held_out = set(valid_books) | set(test_books)
  return {"train": ParallelSet(pair, "train", *map(tuple, select(lambda b: b not in held_out))),
          "valid": ParallelSet(pair, "valid", *map(tuple, select(lambda b: b in valid_books))),
          "bible_test": ParallelSet(pair, "bible_test", *map(tuple, select(lambda b: b in test_books)))}


def read_sets(data_dir: pathlib.Path, pairs: tuple[str, ...], valid_books: tuple[str, ...],
              test_books: tuple[str, ...]) -> dict[str, dict[str, ParallelSet]]:
  """{pair: {set name: ParallelSet}} for every pair in ``pairs``."""
  out = {}
  for pair in pairs:
    language = pair.split("-")[0]
    out[pair] = (bible_sets(data_dir, valid_books, test_books) if language == BIBLE_LANGUAGE
                 else multi30k_sets(data_dir, language))
  return out

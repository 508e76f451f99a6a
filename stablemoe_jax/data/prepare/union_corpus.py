"""The shared corpora as one multilingual LM corpus of plain text files, one file per source and split.

    python -m stablemoe_jax.data.prepare.union_corpus --data_dir /path/to/shared/data --out runs/union_corpus

writes, from the shared data folder (``$STABLEMOE_DATA_DIR`` without ``--data_dir``; its README names the corpora):

    OUT/train/SOURCE.txt   the source's training part   (PTB train; Multi30k ``train.*``; the Bible's training books)
    OUT/valid/SOURCE.txt   its held-out part for validation (PTB valid; Multi30k ``val.*``; the Bible's valid books)
    OUT/test/SOURCE.txt    its held-out part for test   (PTB test; Multi30k ``test_2016_flickr.*``; the test books)
    OUT/manifest.json      {sources, settings, files: {"valid/ptb.txt": {lines, md5, empty_lines_dropped, source}}}

for the sources ``SOURCES``: ``ptb``, ``multi30k_{en,de,fr,cs}`` (each language's side of the aligned files) and
``bible_{en,es}``. The Bible's held-out books are ``configs/mt_cpu.py``'s (``data.bible_valid_books`` /
``bible_test_books``), so no held-out verse is trained on in either task. Multi30k's test set is
``test_2016_flickr``, the one year whose files exist in all four languages. The lines are read by the translation
task's readers (``data/translation/corpora.py``) and PTB's locate, stripped, empty lines left out (the LM
pipelines drop them too), in the sources' order; the same inputs always give the same bytes.
``configs/lm_multi_cpu.py`` trains on the result (docs/data.md, "The union corpus").
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys

from stablemoe_jax.core.errors import DataError, DataNotFoundError
from stablemoe_jax.data.common import locate
from stablemoe_jax.data.common import text
from stablemoe_jax.data.translation import corpora

SPLITS = ("train", "valid", "test")
SOURCES = ("ptb", "multi30k_en", "multi30k_de", "multi30k_fr", "multi30k_cs", "bible_en", "bible_es")
MULTI30K_TEST = "test_2016_flickr"  # the test year with files in en, de, fr and cs
BIBLE_VALID_BOOKS = "Ruth,Jonah,Phil"  # configs/mt_cpu.py's data.bible_valid_books (tests check they agree)
BIBLE_TEST_BOOKS = "Esth,Jas,1John"  # configs/mt_cpu.py's data.bible_test_books
MANIFEST = "manifest.json"


def _ptb_lines(data_dir: pathlib.Path) -> dict[str, list[str]]:
  files = locate.corpus_files(data_dir, "ptb")
  return {split: list(text.iter_lines(files[split])) for split in SPLITS}


def _multi30k_lines(data_dir: pathlib.Path) -> dict[str, dict[str, list[str]]]:
  """{language: {split: lines}}: each X-en pair's source side; English from the de-en files (the same en files)."""
  out = {}
  for language in corpora.MULTI30K_LANGUAGES:
    sets = corpora.multi30k_sets(data_dir, language)
    chosen = {"train": sets["train"], "valid": sets["valid"], "test": sets[MULTI30K_TEST]}
    out[language] = {split: list(s.sources) for split, s in chosen.items()}
    if language == "de":
      out["en"] = {split: list(s.targets) for split, s in chosen.items()}
  return out


def _bible_lines(data_dir: pathlib.Path, valid_books: str, test_books: str) -> dict[str, dict[str, list[str]]]:
  sets = corpora.bible_sets(data_dir, corpora.parse_books(valid_books), corpora.parse_books(test_books))
  chosen = {"train": sets["train"], "valid": sets["valid"], "test": sets["bible_test"]}
  return {"es": {split: list(s.sources) for split, s in chosen.items()},
          "en": {split: list(s.targets) for split, s in chosen.items()}}


def source_lines(data_dir: pathlib.Path, valid_books: str = BIBLE_VALID_BOOKS, test_books: str = BIBLE_TEST_BOOKS
                 ) -> dict[str, dict[str, list[str]]]:
  """{source: {split: its lines as read (stripped, empty ones kept)}} for every source of ``SOURCES``."""
  multi30k, bible = _multi30k_lines(data_dir), _bible_lines(data_dir, valid_books, test_books)
  out = {"ptb": _ptb_lines(data_dir)}
  for source in SOURCES[1:]:
    corpus, language = source.split("_")
    out[source] = (multi30k if corpus == "multi30k" else bible)[language]
  return out


def _write(path: pathlib.Path, lines: list[str]) -> dict:
  kept = [line for line in lines if line]
  data = "".join(line + "\n" for line in kept).encode("utf-8")
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_bytes(data)
  tmp.replace(path)
  return {"lines": len(kept), "empty_lines_dropped": len(lines) - len(kept), "md5": hashlib.md5(data).hexdigest()}


def _origin(source: str, split: str, valid_books: str, test_books: str) -> str:
  """Which shared file (and which part of it) a written file holds, for the manifest."""
  if source == "ptb":
    return f"ptb/ptb.{split}.txt"
  corpus, language = source.split("_")
  if corpus == "multi30k":
    stem = {"train": "train", "valid": "val", "test": MULTI30K_TEST}[split]
    return f"multi30k/{stem}.{language}"
  books = {"train": f"all books but {valid_books},{test_books}", "valid": valid_books, "test": test_books}[split]
  return f"bible_es_en/bible.{language} ({books})"


def write_union_corpus(data_dir: pathlib.Path, out: pathlib.Path, valid_books: str = BIBLE_VALID_BOOKS,
                       test_books: str = BIBLE_TEST_BOOKS) -> dict:
  """Writes ``out/{split}/{source}.txt`` for every source and split and ``out/manifest.json``; returns the manifest.

  Raises:
    DataNotFoundError: a corpus file is missing; DataError: a file is not UTF-8 or a book name is unknown.
  """
  out = pathlib.Path(out)
  try:
    lines = source_lines(pathlib.Path(data_dir), valid_books, test_books)
  except ValueError as error:  # an unknown or shared held-out book (corpora.bible_sets)
    if isinstance(error, DataError):
      raise
    raise DataError(str(error)) from None
  files = {}
  for source in SOURCES:
    for split in SPLITS:
      name = f"{split}/{source}.txt"
      files[name] = {**_write(out / name, lines[source][split]), "source": source,
                     "from": _origin(source, split, valid_books, test_books)}
  manifest = {"sources": list(SOURCES), "splits": list(SPLITS), "multi30k_test": MULTI30K_TEST,
              "bible_valid_books": valid_books, "bible_test_books": test_books, "files": files}
  (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
  return manifest


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m stablemoe_jax.data.prepare.union_corpus",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--data_dir", default="", help="The shared data folder ('': $STABLEMOE_DATA_DIR).")
  parser.add_argument("--out", required=True, help="Folder that gets train/, valid/, test/ and manifest.json.")
  parser.add_argument("--bible_valid_books", default=BIBLE_VALID_BOOKS, help="The Bible's validation books.")
  parser.add_argument("--bible_test_books", default=BIBLE_TEST_BOOKS, help="The Bible's test books.")
  args = parser.parse_args(argv)
  try:
    data_dir = locate.resolve_data_dir(args.data_dir, "ptb")
    manifest = write_union_corpus(data_dir, pathlib.Path(args.out), args.bible_valid_books, args.bible_test_books)
  except (DataError, DataNotFoundError) as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  for name, entry in manifest["files"].items():
    print(f"{args.out}/{name}: {entry['lines']} lines")
  return 0


if __name__ == "__main__":
  sys.exit(main())

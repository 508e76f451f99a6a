"""A user's own parallel corpora (``data.corpus = "files"``, ``configs/mt_files.py``): which files make which sets.

The data section names the pairs and one glob template per split::

    data.pairs       = "xx-en,yy-en"                    # SOURCE-TARGET codes; one target language for all pairs
    data.train_files = "/data/{pair}/train.*.{lang}"    # comma-separated globs (plain, .gz or .zst)
    data.valid_files = "/data/{pair}/valid.{lang}"
    data.test_files  = "/data/{pair}/test.{lang}"

For pair ``xx-en``, ``{pair}`` becomes ``xx-en`` and ``{lang}`` becomes ``xx`` for the source files and ``en``
for the target files. Each side's globs are expanded as the LM's inputs are (``shards.expand_inputs``: each glob
sorted, in order, no repeats) and the i-th source file is paired with the i-th target file, so the two sides'
file names must sort alike (``train.00.xx`` with ``train.00.en``). A pair's sets are ``train``, ``valid`` and
``test`` (each file pair of a split a part of that set, in order); the files of a pair are line-aligned, one
sentence a line, ``\\n``-ended (``shards.plan_aligned`` stops on different line counts naming both files).

Everything here is checked before any work: ``check_config`` without the file system (``config_validation``),
``file_pairs`` with it (every glob matches, each side has as many files as the other).
"""
from __future__ import annotations

import pathlib
import re

from stablemoe_jax.core.settings import TranslationDataSettings
from stablemoe_jax.data.common import shards

SPLITS = {"train": "train_files", "valid": "valid_files", "test": "test_files"}  # set name -> config key
_CODE = r"[A-Za-z][A-Za-z0-9_]*"
_PAIR = re.compile(rf"^({_CODE})-({_CODE})$")

FilePairs = dict[tuple[str, str], list[tuple[pathlib.Path, pathlib.Path]]]


def parse_pairs(pairs: str) -> tuple[str, ...]:
  """``"xx-en,yy-en"`` -> ("xx-en", "yy-en").

  Raises:
    ValueError: no pair, a pair not shaped SOURCE-TARGET, a source named twice, or two target languages.
  """
  names = tuple(p.strip() for p in str(pairs).split(",") if p.strip())
  bad = [p for p in names if not _PAIR.match(p)]
  if not names or bad:
    raise ValueError(f"data.pairs={pairs!r}: {'no pair given' if not names else f'unknown pair(s) {bad}'}; give "
                     f"SOURCE-TARGET language codes (letters, digits, _), e.g. --config.data.pairs=de-en,xx-en.")
  sources = [p.split("-")[0] for p in names]
  targets = sorted({p.split("-")[1] for p in names})
  if len(set(sources)) < len(sources) or len(targets) > 1:
    raise ValueError(f"data.pairs={pairs!r}: each source language once and one target language for all pairs "
                     f"(the model tags the source only), got targets {targets}.")
  return names


def check_config(data: TranslationDataSettings) -> None:
  """The checks of ``data`` that need no file system; raises ValueError (one line naming the key and the fix)."""
  parse_pairs(data.pairs)
  for key in SPLITS.values():
    template = getattr(data, key)
    if not template.strip():
      raise ValueError(f"data.{key} is empty; set it to comma-separated globs with {{lang}}, e.g. "
                       f"--config.data.{key}='/data/{{pair}}/{key.split('_')[0]}.{{lang}}'.")
    if "{lang}" not in template:
      raise ValueError(f"data.{key}={template!r} has no {{lang}}: it names the source files (the pair's source "
                       f"code) and the target files (its target code), e.g. '/data/{{pair}}/train.{{lang}}'.")
    try:
      template.format(pair="xx-en", lang="xx")
    except (KeyError, IndexError, ValueError) as error:
      raise ValueError(f"data.{key}={template!r}: only {{pair}} and {{lang}} may stand in braces ({error!r}).") from None


def settings(data: TranslationDataSettings) -> dict:
  """What the prepared data of ``data`` depends on (the manifest's and the tokenizer's ``settings``)."""
  check_config(data)
  return {"corpus": "files", "pairs": list(parse_pairs(data.pairs)),
          **{key: str(getattr(data, key)) for key in SPLITS.values()},
          "sentencepiece_vocab_size": int(data.sentencepiece_vocab_size)}


def _side(template: str, key: str, pair: str, lang: str) -> list[pathlib.Path]:
  patterns = template.format(pair=pair, lang=lang)
  try:
    return shards.expand_inputs(patterns, f"data.{key} ({pair}, {lang} side)")
  except shards.EmptyInputError as error:
    raise shards.EmptyInputError(f"{error} Fix --config.data.{key}={template!r} ({{pair}} -> {pair}, {{lang}} -> "
                                 f"{lang}): the files must exist on this machine.") from None


def file_pairs(data: TranslationDataSettings) -> FilePairs:
  """{(pair, set name): [(source file, target file)]} of every pair of ``data.pairs`` and split, in order.

  Raises:
    ValueError: see ``check_config``.
    EmptyInputError: a glob matches no file, or a split's two sides have different numbers of files.
  """
  check_config(data)
  out: FilePairs = {}
  for pair in parse_pairs(data.pairs):
    source_language, target_language = pair.split("-")
    for name, key in SPLITS.items():
      template = getattr(data, key)
      sources = _side(template, key, pair, source_language)
      targets = _side(template, key, pair, target_language)
      if len(sources) != len(targets):
        raise shards.EmptyInputError(
            f"data.{key} for {pair}: {len(sources)} {source_language} file(s) ({sources[0]}, ...) but "
            f"{len(targets)} {target_language} file(s) ({targets[0]}, ...); each source file needs its target "
            f"file, with names that sort alike and differ in {{lang}}.")
      shared = sorted(set(sources) & set(targets))
      if shared:
        raise shards.EmptyInputError(f"data.{key} for {pair}: {shared[0]} matches both the {source_language} and "
                                     f"the {target_language} glob; put {{lang}} where the file names differ.")
      out[pair, name] = list(zip(sources, targets))
  return out

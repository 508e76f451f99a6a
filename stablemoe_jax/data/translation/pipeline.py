"""Translation data: parallel sets -> joint sentencepiece ids -> mixed-pair training batches and eval batches.

    parallel (named sets of aligned lines) -> joint_tokenizer (trained on the training sources + targets)
      -> prepared arrays in workdir/data/translation (flat ids + offsets per set, one .npz each)
      -> batches.py: MixedPairIterator (training rows drawn pair by pair with weight ~ n^(1/T)) / eval batches

This module prepares and loads the encoded sets (``load_translation_data`` -> ``TranslationData``); ``batches.py``
draws the batches from them. A pair whose source or target does not fit a batch's length is never trained on or
scored; each set's count of them is printed and written to ``workdir/data/translation/length_report.json``.

Simpler than the LM's TFDS ``array_record`` path: the encoded sets are numpy ``.npz`` files with a
``manifest.json`` of the settings and the tokenizer's md5; a run's workdir alone (tokenizer + arrays) is
enough to resume or evaluate it without the raw corpora.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Iterator

import numpy as np

from stablemoe_jax.core.settings import TranslationDataSettings
from stablemoe_jax.data.common.locate import ENV_VAR, DataError, DataNotFoundError
from stablemoe_jax.data.translation import corpora as parallel
from stablemoe_jax.data.translation.rows import EncodedSet, _flatten, encode_set
from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, JointSentencePiece
from stablemoe_jax.data.translation.pair_records import RecordSet

MANIFEST = "manifest.json"
LENGTH_REPORT = "length_report.json"


@dataclasses.dataclass
class TranslationData:
  """The prepared translation corpora: the tokenizer and {pair: {set name: EncodedSet}}."""

  tokenizer: JointSentencePiece
  sets: dict[str, dict[str, EncodedSet]]
  directory: pathlib.Path  # the prepared data: tokenizer, arrays, and the evaluation sets' raw text

  def raw_text(self, pair: str, name: str) -> tuple[list[str], list[str]]:
    """The untokenised (source lines, reference lines) of an evaluation set, as the corpus files have them."""
    # Lines end at "\n" only (a lone "\r" inside a line is text, as in the corpus files): no universal newlines.
    read = lambda side: (self.directory / f"{pair}.{name}.{side}.txt").read_bytes().decode("utf-8").split("\n")[:-1]
    return read("src"), read("ref")

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.vocab_size

  @property
  def pairs(self) -> tuple[str, ...]:
    return tuple(self.sets)

  def split_sets(self, split: str) -> list[EncodedSet]:
    """'train' / 'valid': each pair's set of that name; 'test': each pair's test sets."""
    if split in ("train", "valid"):
      return [self.sets[p][split] for p in self.pairs]
    if split == "test":
      return [s for p in self.pairs for name, s in self.sets[p].items() if name not in ("train", "valid")]
    raise ValueError(f"unknown split {split!r}; choose train, valid or test.")

  def length_report(self, max_len: int) -> dict[str, dict[str, int]]:
    """{pair: {set name: pairs that do not fit max_len}} (only sets with any)."""
    report = {}
    for pair, sets in self.sets.items():
      for name, s in sets.items():
        over = len(s) - len(s.fitting(max_len))
        if over:
          report.setdefault(pair, {})[name] = over
    return report

  def train_token_counts(self, vocab_size: int) -> np.ndarray:
    """int64 [vocab_size]: ids of the training sources and decoder inputs (the ids the routers read)."""
    counts = np.zeros(vocab_size, np.int64)
    for s in self.split_sets("train"):
      for ids in ((s.source_ids, s.target_ids) if isinstance(s, EncodedSet) else s.iter_ids()):
        counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
      counts[BOS_ID] += len(s)
    return counts


def settings(data: TranslationDataSettings) -> dict:
  """What the prepared data of ``data`` depends on (the manifest's and the tokenizer's ``settings``), by corpus."""
  if data.corpus == "files":  # a user's own parallel files
    from stablemoe_jax.data.translation import files as parallel_files
    return parallel_files.settings(data)
  if data.corpus == "wmt":  # the paper's WMT pairs, from prepared TFDS builders
    from stablemoe_jax.data.translation import wmt
    return wmt.settings(data)
  return {"pairs": list(parallel.parse_pairs(data.pairs)),
          "bible_valid_books": list(parallel.parse_books(data.bible_valid_books)),
          "bible_test_books": list(parallel.parse_books(data.bible_test_books)),
          "sentencepiece_vocab_size": int(data.sentencepiece_vocab_size)}


def data_dir(data: TranslationDataSettings) -> pathlib.Path | None:
  """The folder of the raw corpora: ``data.data_dir``, else $STABLEMOE_DATA_DIR; None if neither is set."""
  configured = data.data_dir or os.environ.get(ENV_VAR, "")
  return pathlib.Path(configured).expanduser() if configured else None


def _save_set(directory: pathlib.Path, s: EncodedSet) -> None:
  np.savez(directory / f"{s.pair}.{s.name}.npz", source_ids=s.source_ids, source_offsets=s.source_offsets,
           target_ids=s.target_ids, target_offsets=s.target_offsets)


def _shard_set(directory: pathlib.Path, pair: str, name: str, manifest: dict) -> EncodedSet | RecordSet:
  """A set prepared by ``prepare`` (shards): training sets read by random access, evaluation sets in memory."""
  records = RecordSet(pair, name, [directory / f for f in manifest["shards"][pair][name]])
  if name == "train":
    return records
  rows = records.pairs(range(len(records)))
  return EncodedSet(pair, name, *_flatten([r[0] for r in rows]), *_flatten([r[1] for r in rows]))


def _load_set(directory: pathlib.Path, pair: str, name: str, manifest: dict | None = None) -> EncodedSet:
  with np.load(directory / f"{pair}.{name}.npz") as f:
    return EncodedSet(pair, name, f["source_ids"], f["source_offsets"], f["target_ids"], f["target_offsets"])


def load_translation_data(data: TranslationDataSettings, prepared_dir: pathlib.Path) -> TranslationData:
  """Prepares (or reuses) the tokenizer and encoded sets of the run's ``data`` settings under
  ``prepared_dir/translation``.

  The raw corpora are read only if nothing matching ``data`` is prepared there yet.

  Raises:
    ValueError: an unknown pair or book.
    DataNotFoundError: nothing prepared and a corpus file is missing (the message names it and the fix).
    DataError: the prepared data was built with other settings.
  """
  wanted = settings(data)
  directory = pathlib.Path(prepared_dir) / "translation"
  manifest_path = directory / MANIFEST
  if manifest_path.is_file():
    manifest = json.loads(manifest_path.read_text())
    if manifest["settings"] != wanted:
      raise DataError(f"{directory} was prepared with other data settings ({manifest['settings']}, this config "
                      f"{wanted}); use a new --workdir or delete {directory}.")
    tokenizer = JointSentencePiece.load(directory / "tokenizer", wanted)
    load = _shard_set if manifest.get("format") == "shards" else _load_set
    sets = {pair: {name: load(directory, pair, name, manifest) for name in names}
            for pair, names in manifest["sets"].items()}
    return TranslationData(tokenizer, sets, directory)
  root = data_dir(data)
  if root is None:
    raise DataNotFoundError(f"no data directory: set --config.data.data_dir or ${ENV_VAR} to the folder holding "
                            f"multi30k/ and bible_es_en/.")
  raw = parallel.read_sets(root, tuple(wanted["pairs"]), tuple(wanted["bible_valid_books"]),
                           tuple(wanted["bible_test_books"]))
  languages = [pair.split("-")[0] for pair in wanted["pairs"]]
  training_text = _training_lines(raw)
  tokenizer = JointSentencePiece.train(training_text, wanted["sentencepiece_vocab_size"], languages)
  directory.mkdir(parents=True, exist_ok=True)
  tokenizer.save(directory / "tokenizer", wanted)
  sets = {pair: {name: encode_set(tokenizer, ps) for name, ps in named.items()} for pair, named in raw.items()}
  for named in sets.values():
    for s in named.values():
      _save_set(directory, s)
  for pair, named in raw.items():
    for name, ps in named.items():
      if name != "train":
        for side, lines in (("src", ps.sources), ("ref", ps.targets)):
          (directory / f"{pair}.{name}.{side}.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
  manifest = {"settings": wanted, "tokenizer_md5": tokenizer.fingerprint(),
              "sets": {pair: list(named) for pair, named in sets.items()},
              "sizes": {pair: {name: len(s) for name, s in named.items()} for pair, named in sets.items()}}
  (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # last: its presence means complete
  return TranslationData(tokenizer, sets, directory)


def _training_lines(raw: dict[str, dict[str, parallel.ParallelSet]]) -> Iterator[str]:
  """Each distinct training file's non-empty lines once (Multi30k's English side is shared by its pairs)."""
  seen_english = False
  for named in raw.values():
    train = named["train"]
    yield from (line for line in train.sources if line)
    multi30k = train.source_language != parallel.BIBLE_LANGUAGE
    if not (multi30k and seen_english):
      yield from (line for line in train.targets if line)
    seen_english = seen_english or multi30k


def write_length_report(data: TranslationData, prepared_dir: pathlib.Path, train_len: int, eval_len: int) -> dict:
  """Counts the pairs that do not fit, prints them once, writes ``length_report.json``; returns the report."""
  report = {"train.seq_len": train_len, "over_train_seq_len": data.length_report(train_len),
            "eval.seq_len": eval_len, "over_eval_seq_len": data.length_report(eval_len)}
  path = pathlib.Path(prepared_dir) / "translation" / LENGTH_REPORT
  path.write_text(json.dumps(report, indent=2) + "\n")
  train_over = sum(n for sets in report["over_train_seq_len"].values() for n in sets.values())
  if train_over:
    print(f"translation data: {train_over} pairs longer than train.seq_len={train_len} are left out of training "
          f"or scoring (per pair and set: {path})", flush=True)
  return report

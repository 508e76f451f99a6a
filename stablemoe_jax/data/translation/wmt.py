"""The paper's WMT setting (fr, cs, de, fi, lv, et, ro, hi, tr -> en) over the public TFDS WMT builders.

``config.data.corpus = "wmt"`` (``configs/mt_wmt.py``) names the pairs; each comes from one TFDS builder
(the WMT year of Wang et al. 2020's multilingual setting, which StableMoE follows). TFDS downloads them from
statmt.org and other hosts, so they are prepared where the network is,

    python -m stablemoe_jax.data.wmt --tfds_data_dir=DIR [--pairs=fr-en,...]

and DIR is then copied to ``data.tfds_data_dir`` of the training machine. Offline, the config is validated and
``--mode=plan`` runs; a run whose TFDS data is not there stops with one line naming the builders to prepare.

``prepare --config configs/mt_wmt.py`` then reads the prepared records (``file_pairs``): each pair's TFDS splits
(train, validation -> valid, test and any other split under its own name, as a test set) are written once as
line-aligned ``raw/PAIR.SET.{src,ref}`` files, and from there they take the path of every other corpus (joint
sentencepiece, pair shards, manifest). Records are read with ``as_data_source`` (array_record), so TensorFlow is
not needed to train; ``python -m stablemoe_jax.data.wmt`` (``data/wmt.py``) writes that format.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Iterator

from stablemoe_jax.core.settings import TranslationDataSettings
from stablemoe_jax.data.common.locate import DataError, DataNotFoundError
from stablemoe_jax.data.translation.files import FilePairs

# pair -> (TFDS builder, its config, the version this codebase was written against)
WMT_BUILDERS = {
    "fr-en": ("wmt15_translate", "fr-en", "1.0.0"),
    "cs-en": ("wmt19_translate", "cs-en", "1.0.0"),
    "de-en": ("wmt19_translate", "de-en", "1.0.0"),
    "fi-en": ("wmt19_translate", "fi-en", "1.0.0"),
    "lv-en": ("wmt17_translate", "lv-en", "1.0.0"),
    "et-en": ("wmt18_translate", "et-en", "1.0.0"),
    "ro-en": ("wmt16_translate", "ro-en", "1.0.0"),
    "hi-en": ("wmt14_translate", "hi-en", "1.0.0"),
    "tr-en": ("wmt18_translate", "tr-en", "1.0.0"),
}
PAPER_PAIRS = ",".join(WMT_BUILDERS)


def parse_wmt_pairs(text: str) -> list[str]:
  """``"fr-en,de-en"`` -> the pairs; a pair without a WMT builder here is a ValueError naming the known ones."""
  pairs = [p.strip() for p in str(text).split(",") if p.strip()]
  unknown = [p for p in pairs if p not in WMT_BUILDERS]
  if not pairs or unknown:
    raise ValueError(f"data.pairs={text!r}: {'no pair' if not pairs else 'unknown WMT pair(s) ' + ', '.join(unknown)}; "
                     f"choose from {PAPER_PAIRS}.")
  return pairs


def builder_name(pair: str) -> str:
  """``"fr-en"`` -> ``"wmt15_translate/fr-en:1.0.0"`` (the name ``tfds.builder`` and ``tfds build`` take)."""
  builder, config, version = WMT_BUILDERS[pair]
  return f"{builder}/{config}:{version}"


def prepared_path(tfds_data_dir: pathlib.Path, pair: str) -> pathlib.Path:
  """Where TFDS keeps a prepared builder: ``DIR/<builder>/<config>/<version>``."""
  builder, config, version = WMT_BUILDERS[pair]
  return pathlib.Path(tfds_data_dir) / builder / config / version


def missing_pairs(data: TranslationDataSettings) -> list[str]:
  """The pairs of ``data.pairs`` whose TFDS data is not prepared under ``data.tfds_data_dir``."""
  root, pairs = data.tfds_data_dir, parse_wmt_pairs(data.pairs)
  if not root:
    return pairs
  return [p for p in pairs if not (prepared_path(root, p) / "dataset_info.json").is_file()]


def require_prepared(data: TranslationDataSettings) -> None:
  """Raises DataNotFoundError (one line: what to prepare where the network is) unless every pair of ``data.pairs``
  is prepared."""
  missing = missing_pairs(data)
  if missing:
    root = data.tfds_data_dir or "<unset: --config.data.tfds_data_dir>"
    raise DataNotFoundError(
        f"WMT data not prepared under data.tfds_data_dir={root}: on a machine with network run "
        f"`python -m stablemoe_jax.data.wmt --tfds_data_dir=DIR --pairs={','.join(missing)}` (TFDS builders "
        f"{', '.join(builder_name(p) for p in missing)}), copy DIR here and set --config.data.tfds_data_dir=DIR.")


SET_NAMES = {"train": "train", "validation": "valid"}  # TFDS split -> set; any other split is a test set
READ_BATCH = 4096  # records a batched array_record read


def _open(tfds_data_dir: pathlib.Path, pair: str):
  """The prepared TFDS builder of ``pair``; a DataError names the fix unless it is array_record."""
  import tensorflow_datasets as tfds
  path = prepared_path(tfds_data_dir, pair)
  builder = tfds.builder_from_directory(str(path))
  file_format = getattr(builder.info.file_format, "value", builder.info.file_format)
  if file_format != "array_record":
    raise DataError(f"{path} was prepared as {file_format}, which needs TensorFlow to read; prepare it again as "
                    f"array_record: `python -m stablemoe_jax.data.wmt --tfds_data_dir=DIR --pairs={pair}`.")
  return builder


def iter_split(builder, split: str, source_language: str, target_language: str) -> Iterator[tuple[str, str]]:
  """(source, target) sentences of one TFDS split in record order; a newline inside a sentence becomes a space
  (the exported files hold one sentence a line)."""
  records = builder.as_data_source(split)
  clean = lambda text: (text.decode("utf-8") if isinstance(text, bytes) else str(text)).replace("\n", " ")
  for start in range(0, len(records), READ_BATCH):
    for record in records.__getitems__(range(start, min(start + READ_BATCH, len(records)))):
      yield clean(record[source_language]), clean(record[target_language])


def _identity(builder, split: str) -> dict:
  """What an exported split was made from: the builder's dataset_info.json and the split's size."""
  info = pathlib.Path(builder.data_dir) / "dataset_info.json"
  return {"builder": builder.info.full_name, "split": split, "examples": builder.info.splits[split].num_examples,
          "dataset_info_sha256": hashlib.sha256(info.read_bytes()).hexdigest()}


def export_split(builder, split: str, pair: str, paths: tuple[pathlib.Path, pathlib.Path]) -> None:
  """Writes the split's sentences to ``paths`` (source, target), unless they already hold this very split
  (a ``.tfds.json`` beside them records what they were made from): unchanged files keep their mtimes, which the
  shards' fingerprint reads."""
  marker = paths[0].with_suffix(".tfds.json")
  identity = _identity(builder, split)
  if all(p.is_file() for p in paths) and marker.is_file() and json.loads(marker.read_text()) == identity:
    return
  import tqdm
  source_language, target_language = pair.split("-")
  temporary = [p.with_name(p.name + ".tmp") for p in paths]
  with temporary[0].open("w", encoding="utf-8", newline="\n") as src, \
       temporary[1].open("w", encoding="utf-8", newline="\n") as ref:
    for source, target in tqdm.tqdm(iter_split(builder, split, source_language, target_language),
                                    total=identity["examples"], desc=f"{pair} {split}", mininterval=5.0):
      src.write(source + "\n")
      ref.write(target + "\n")
  for tmp, path in zip(temporary, paths):
    tmp.replace(path)
  marker.write_text(json.dumps(identity) + "\n")


def file_pairs(data: TranslationDataSettings, directory: pathlib.Path) -> FilePairs:
  """{(pair, set name): [(source file, target file)]}: each of ``data.pairs``' TFDS splits exported under
  ``directory/raw``.

  Raises:
    DataNotFoundError: a pair's TFDS data is not under ``data.tfds_data_dir`` (``require_prepared``).
    DataError: a pair was prepared in a format other than array_record.
  """
  require_prepared(data)
  raw = pathlib.Path(directory) / "raw"
  raw.mkdir(parents=True, exist_ok=True)
  out = {}
  for pair in parse_wmt_pairs(data.pairs):
    builder = _open(pathlib.Path(data.tfds_data_dir), pair)
    if "train" not in builder.info.splits:
      raise DataError(f"{builder.data_dir} has no train split "
                      f"(splits: {', '.join(builder.info.splits)}); prepare {builder_name(pair)} again.")
    for split in builder.info.splits:
      name = SET_NAMES.get(split, split)
      paths = raw / f"{pair}.{name}.src", raw / f"{pair}.{name}.ref"
      export_split(builder, split, pair, paths)
      out[pair, name] = [paths]
  return out


def settings(data: TranslationDataSettings) -> dict:
  """What the prepared data of ``data`` depends on (the manifest's and the tokenizer's ``settings``); where the TFDS
  data lies is not part of it (the exported files' identity is, through the shards' fingerprint)."""
  return {"corpus": "wmt", "pairs": parse_wmt_pairs(data.pairs),
          "sentencepiece_vocab_size": int(data.sentencepiece_vocab_size)}

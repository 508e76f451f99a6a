"""A TFDS builder writing a tokenized text corpus as array_record files.

One record per non-empty line (see `text.iter_lines`), in file order:

    {'tokens': int32 [L + 1]}   # the line's L token ids, then eos

Splits 'train', 'valid', 'test'. No TensorFlow is needed: the files are
array_record and are read back with `builder.as_data_source(split)` (a
random-access source grain can read).

On disk (under the given `data_dir`, the run's prepared-data directory):

    data_dir/lm_corpus/{corpus}-{tokenizer kind}-{fingerprint}/1.0.0/
        lm_corpus-{split}.array_record-00000-of-00001, dataset_info.json, ...

The config name carries a fingerprint of the tokenizer (vocabulary / model
bytes), the input files (name, size, md5) and `FORMAT_VERSION`, so a changed
tokenizer or corpus never silently reuses stale records; preparing an already
prepared fingerprint is a no-op (milliseconds).

Limits: TFDS sorts a split's examples in memory up to 1 GiB of serialized
records and spills to disk through tf.io.gfile beyond that, which needs
TensorFlow; corpora above ~250M tokens per split need TensorFlow installed.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Iterator, Mapping

import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core import utils as tfds_utils

from stablemoe_jax.data.common import text
from stablemoe_jax.data.common.tokenizers import Tokenizer

# Bump when the record layout or line handling changes (invalidates old records).
FORMAT_VERSION = 1


def fingerprint(tokenizer: Tokenizer, split_files: Mapping[str, os.PathLike | str]) -> str:
  """12 hex digits identifying (tokenizer, input files, record format)."""
  h = hashlib.sha256()
  h.update(f'format={FORMAT_VERSION};kind={tokenizer.kind};'.encode())
  h.update(f'tokenizer={tokenizer.fingerprint()};'.encode())
  for split in sorted(split_files):
    path = pathlib.Path(split_files[split])
    h.update(f'{split}={path.name}:{path.stat().st_size}:{text.file_md5(path)};'.encode())
  return h.hexdigest()[:12]


class LmCorpus(tfds.core.GeneratorBasedBuilder):
  """Tokenized LM corpus: one int32 record (line ids + eos) per non-empty line."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Line records of token ids followed by eos.'}

  # TFDS's default `code_path` (used to look for a checksums.tsv beside the
  # builder) needs the `importlib_resources` backport for a builder that lives
  # in a package; this builder downloads nothing, so point it at this file.
  @tfds_utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)

  def __init__(
      self,
      *,
      split_files: Mapping[str, os.PathLike | str],
      tokenizer: Tokenizer,
      corpus: str,
      data_dir: os.PathLike | str,
  ):
    """
    Args:
      split_files: {split name: text file}, e.g. from `locate.corpus_files`.
      tokenizer: encodes each line (eos is appended here).
      corpus: short corpus name used in the config name, e.g. 'ptb'.
      data_dir: output directory for the prepared records.
    """
    self._split_files = {s: pathlib.Path(p) for s, p in split_files.items()}
    self._tokenizer = tokenizer
    fp = fingerprint(tokenizer, self._split_files)
    config = tfds.core.BuilderConfig(
        name=f'{corpus}-{tokenizer.kind}-{fp}',
        description=f'{corpus} tokenized with {tokenizer.kind} '
        f'(vocab {tokenizer.vocab_size}), fingerprint {fp}.',
    )
    super().__init__(
        data_dir=os.fspath(data_dir), config=config, file_format='array_record'
    )

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='Tokenized language-modeling corpus, one record per line.',
        features=tfds.features.FeaturesDict(
            {'tokens': tfds.features.Tensor(shape=(None,), dtype=np.int32)}
        ),
        # Keep file order: the LM stream is the concatenation of the lines.
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(
            vocab_size=self._tokenizer.vocab_size,
            eos_id=self._tokenizer.eos_id,
            tokenizer_kind=self._tokenizer.kind,
        ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Inputs are local files given to the constructor.
    return {split: self._generate_examples(path) for split, path in self._split_files.items()}

  def _generate_examples(self, path: pathlib.Path) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    encode, eos = self._tokenizer.encode, self._tokenizer.eos_id
    for i, line in enumerate(text.iter_lines(path)):
      ids = encode(line)
      ids.append(eos)
      yield i, {'tokens': np.asarray(ids, dtype=np.int32)}

  def prepare(self) -> None:
    """Writes the records unless this fingerprint is already prepared."""
    self.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )

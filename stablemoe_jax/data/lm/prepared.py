"""A run's prepared data (tokenizer + records) read back without the raw corpus.

After `load_lm_data` prepares the records it writes a manifest beside them,

    prepared_dir/prepared.json  {corpus, tokenizer, sentencepiece_vocab_size, vocab_size,
                                 tokenizer_fingerprint, records, splits}

(`records` = the TFDS dataset directory, relative to prepared_dir). Evaluating
or resuming a run whose raw corpus is not on this machine reads the tokenizer
and the records named there, after checking that they were prepared for the
config's `data` section (corpus, tokenizer kind, sentencepiece vocabulary
size) and that the tokenizer files are the ones the records were encoded with.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import tensorflow_datasets as tfds

from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.common import locate
from stablemoe_jax.data.common import shards
from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.lm import eval_sets
from stablemoe_jax.data.lm.stream import FieldSource, RecordSource

MANIFEST = 'prepared.json'
SHARDS_FORMAT = 'shards'  # The manifest's 'format' when `stablemoe_jax.prepare` wrote it.


class PreparedDataMismatchError(locate.DataError):
  """The prepared data in a workdir was built for another data config (or is incomplete)."""


def wanted(data: LMDataSettings) -> dict[str, Any]:
  """The part of the manifest that the run's ``data`` settings determine."""
  out = {'corpus': data.corpus, 'tokenizer': data.tokenizer}
  if out['tokenizer'] == 'sentencepiece':
    out['sentencepiece_vocab_size'] = int(data.sentencepiece_vocab_size)
  return out


def split_inputs(data: LMDataSettings) -> dict[str, list[pathlib.Path]]:
  """{split: input files} of the run's ``data`` settings: train, valid, test, then each of ``data.eval_sets``'
  sets' valid and test files (``valid@NAME``, ``test@NAME``; ``eval_sets.py``)."""
  if data.corpus == 'files':
    files = {split: shards.expand_inputs(getattr(data, f'{split}_files'), f'data.{split}_files')
             for split in locate.SPLITS}
    for split, pattern in eval_sets.set_globs(data).items():
      files[split] = shards.expand_inputs(pattern, f'data.eval_sets ({split})')
    return files
  data_dir = locate.resolve_data_dir(data.data_dir, data.corpus)
  return {split: [path] for split, path in locate.corpus_files(data_dir, data.corpus).items()}


settings = wanted  # the manifest keys `main` compares when it reads the shards


def write_manifest(prepared_dir: pathlib.Path, data: LMDataSettings, tokenizer: tokenizers.Tokenizer,
                   records_dir: pathlib.Path, splits: list[str]) -> None:
  """Records what `prepared_dir` holds for the `data` settings (atomically: a manifest names complete data only)."""
  manifest = dict(wanted(data), vocab_size=tokenizer.vocab_size,
                  tokenizer_fingerprint=tokenizer.fingerprint(),
                  records=str(records_dir.resolve().relative_to(prepared_dir.resolve())), splits=sorted(splits))
  tmp = prepared_dir / (MANIFEST + '.tmp')
  tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + '\n')
  tmp.replace(prepared_dir / MANIFEST)


def has_manifest(prepared_dir: pathlib.Path) -> bool:
  return (prepared_dir / MANIFEST).is_file()


def is_sharded(prepared_dir: pathlib.Path) -> bool:
  """Whether the manifest was written by `stablemoe_jax.prepare` (shards, read by `grain_reader`)."""
  path = prepared_dir / MANIFEST
  return path.is_file() and json.loads(path.read_text()).get('format') == SHARDS_FORMAT


def load(prepared_dir: pathlib.Path, data: LMDataSettings
         ) -> tuple[tokenizers.Tokenizer, dict[str, RecordSource], pathlib.Path]:
  """The tokenizer, {split: record source} and the records' folder saved in `prepared_dir` for the `data` settings.

  Raises:
    PreparedDataMismatchError: the manifest was written for another corpus /
      tokenizer / vocabulary size, or the tokenizer or records it names are
      missing or differ.
  """
  manifest = json.loads((prepared_dir / MANIFEST).read_text())
  fix = ('Give the raw corpus (--config.data.data_dir=DIR or STABLEMOE_DATA_DIR=DIR) so the data can be '
         'rebuilt, or use a new --workdir.')
  expected = wanted(data)
  differ = [f'data.{k}={v!r} but they were prepared with {manifest.get(k)!r}'
            for k, v in expected.items() if manifest.get(k) != v]
  if differ:
    raise PreparedDataMismatchError(
        f'The prepared data in {prepared_dir} does not match this config: {"; ".join(differ)}. '
        f'Run with the data settings that prepared them. {fix}')
  try:
    tokenizer = tokenizers.load_tokenizer(prepared_dir / 'tokenizer')
  except (OSError, ValueError, KeyError) as error:
    raise PreparedDataMismatchError(f'Cannot read the tokenizer in {prepared_dir / "tokenizer"} ({error}). {fix}')
  if tokenizer.kind != manifest['tokenizer'] or tokenizer.fingerprint() != manifest['tokenizer_fingerprint']:
    raise PreparedDataMismatchError(
        f'The tokenizer in {prepared_dir / "tokenizer"} is not the one the records in {prepared_dir} were '
        f'encoded with (fingerprint {tokenizer.fingerprint()} != {manifest["tokenizer_fingerprint"]}). {fix}')
  records = prepared_dir / manifest['records']
  try:
    builder = tfds.builder_from_directory(str(records))
    sources = {split: FieldSource(builder.as_data_source(split=split), 'tokens') for split in manifest['splits']}
  except Exception as error:  # TFDS raises several types for a missing or partial directory.
    raise PreparedDataMismatchError(f'Cannot read the prepared records in {records} ({error}). {fix}') from None
  if builder.info.metadata.get('vocab_size') != tokenizer.vocab_size:
    raise PreparedDataMismatchError(
        f'The records in {records} were written for vocabulary size {builder.info.metadata.get("vocab_size")}, '
        f'the tokenizer in {prepared_dir / "tokenizer"} has {tokenizer.vocab_size}. {fix}')
  return tokenizer, sources, records

"""`prepare --config` of a translation config (`config.task = "translation"`): parallel sets into pair shards.

Writes, under `DIR/data/translation` (where `main` reads them, see `translation.load_translation_data`):

    tokenizer/                     the joint sentencepiece model (trained on a seeded sample of at most
                                   `--sentencepiece_sample_lines` lines of the training sources + targets)
    raw/PAIR.NAME.{src,ref}        the Bible's sets as line-aligned files (its sets are chosen by book)
    shards/PAIR_NAME/SHARD.*       the pair shards (layout in `shard_writer`, one record per sentence pair)
    PAIR.NAME.{src,ref}.txt        each evaluation set's raw text (for BLEU)
    manifest.json                  {format: 'shards', settings, tokenizer_md5, sets: {pair: [name]},
                                    shards: {pair: {name: [file]}}, sizes: {pair: {name: pairs}},
                                    skipped_files: [{path, error}]}

Steps as for the LM (`prepare`): tokenizer -> plan (`shards.plan_aligned`: the same line ranges of source and
target, `--shard_pairs` a shard) -> one Beam task per shard (`beam_pipeline`, `shard_writer`) -> manifest.
Resumable, fingerprinted and cleaned of stale shards the same way. The inputs: Multi30k and the Bible, a
user's own files (`data.corpus = "files"`, `parallel_files`), or the WMT pairs' prepared TFDS records (`"wmt"`,
exported once to `raw/` by `wmt.file_pairs`). `--skip_bad_files`: a file pair with a line that is
not UTF-8 is left out of the tokenizer and of its set, and listed under `skipped_files` in the report (a set left
without pairs stops the run); without it the first bad line stops the run, naming its file and line.
"""
from __future__ import annotations

import hashlib
import json
import pathlib

from stablemoe_jax.core.settings import TranslationDataSettings
from stablemoe_jax.data.common import shards
from stablemoe_jax.data.common import text
from stablemoe_jax.data.common.locate import DataNotFoundError, ENV_VAR
from stablemoe_jax.data.prepare import beam_pipeline
from stablemoe_jax.data.prepare import lm as lm_prepare
from stablemoe_jax.data.prepare import shard_writer
from stablemoe_jax.data.translation import corpora as parallel
from stablemoe_jax.data.translation import files as parallel_files
from stablemoe_jax.data.translation import pipeline as translation
from stablemoe_jax.data.translation import wmt
from stablemoe_jax.data.translation.files import FilePairs
from stablemoe_jax.data.translation.joint_tokenizer import JointSentencePiece



def _write_if_changed(path: pathlib.Path, lines: tuple[str, ...]) -> None:
  """Keeps an unchanged file untouched: its mtime is part of the shards' fingerprint."""
  content = ''.join(f'{line}\n' for line in lines).encode('utf-8')  # Bytes: a lone '\r' in a line stays.
  if not path.is_file() or path.read_bytes() != content:
    path.write_bytes(content)


def file_pairs(data: TranslationDataSettings, directory: pathlib.Path) -> FilePairs:
  """{(pair, set name): [(source file, target file)]} of the ``data`` settings' pairs: Multi30k and the Bible, the
  user's own files (``data.corpus = "files"``, ``parallel_files``) or the prepared TFDS WMT builders (``"wmt"``)."""
  if data.corpus == 'files':
    return parallel_files.file_pairs(data)
  if data.corpus == 'wmt':
    return wmt.file_pairs(data, directory)
  settings = translation.settings(data)
  data_dir = translation.data_dir(data)
  if data_dir is None:
    raise DataNotFoundError(f'no data directory: set --config.data.data_dir or ${ENV_VAR}.')
  out: FilePairs = {}
  for pair in settings['pairs']:
    language = pair.split('-')[0]
    if language == parallel.BIBLE_LANGUAGE:
      raw = directory / 'raw'
      raw.mkdir(parents=True, exist_ok=True)
      sets = parallel.bible_sets(data_dir, tuple(settings['bible_valid_books']), tuple(settings['bible_test_books']))
      for name, ps in sets.items():
        paths = raw / f'{pair}.{name}.src', raw / f'{pair}.{name}.ref'
        _write_if_changed(paths[0], ps.sources)
        _write_if_changed(paths[1], ps.targets)
        out[pair, name] = [paths]
    else:
      root = data_dir / 'multi30k'
      for name, stem in parallel.multi30k_files(language).items():
        paths = root / f'{stem}.{language}', root / f'{stem}.{parallel.TARGET_LANGUAGE}'
        for path in paths:
          if not path.is_file():
            raise DataNotFoundError(f'{path} is missing; point --config.data.data_dir (or ${ENV_VAR}) at the '
                                    f'folder holding multi30k/ and bible_es_en/.')
        out[pair, name] = [paths]
  return out


def prepare_tokenizer(settings: dict, train_files: list[pathlib.Path], directory: pathlib.Path,
                      sample_lines: int) -> JointSentencePiece:
  """The joint model in `directory` if built from these files and settings, else a new one (saved)."""
  identity = '\n'.join(shards.file_identity(p) for p in train_files)
  meta = dict(settings, train_inputs=hashlib.sha256(identity.encode()).hexdigest(), sample_lines=sample_lines)
  try:
    tokenizer = JointSentencePiece.load(directory, meta)
  except translation.DataError:
    tokenizer = None
  if tokenizer is None:
    lines = shards.iter_lines(shards.plan_split('train', train_files, 1 << 62, ''))
    languages = [pair.split('-')[0] for pair in settings['pairs']]
    tokenizer = lm_prepare.train_on_lines(
        lambda checked: JointSentencePiece.train(checked, settings['sentencepiece_vocab_size'], languages,
                                                 sample_lines), lines)
    tokenizer.save(directory, meta)
  return tokenizer


def _distinct(file_pairs: list[tuple[pathlib.Path, pathlib.Path]]) -> list[pathlib.Path]:
  """Both sides' files in order, each once (Multi30k's train.en is the target of three pairs)."""
  return list(dict.fromkeys(p for pair in file_pairs for p in pair))


def prepare(data: TranslationDataSettings, prepared_dir: pathlib.Path, options: lm_prepare.Options) -> dict:
  """Tokenizer, pair shards and manifest of the run's `data` settings in `prepared_dir/translation`; returns the
  report."""
  settings = translation.settings(data)
  directory = pathlib.Path(prepared_dir) / 'translation'
  out_dir = directory / 'shards'
  pairs = file_pairs(data, directory)
  train_pairs = [pair for (_, name), files in pairs.items() if name == 'train' for pair in files]
  try:
    tokenizer = prepare_tokenizer(settings, _distinct(train_pairs), directory / 'tokenizer',
                                  options.sentencepiece_sample_lines)
  except text.BadCorpusError:
    good = [pair for pair in train_pairs if all(map(lm_prepare._readable, pair))]
    if not options.skip_bad_files or not good:
      raise
    tokenizer = prepare_tokenizer(settings, _distinct(good), directory / 'tokenizer', options.sentencepiece_sample_lines)
  fingerprint = hashlib.sha256(json.dumps([lm_prepare.FORMAT_VERSION, 'pairs', tokenizer.fingerprint()]).encode()
                               ).hexdigest()
  specs = [spec for (pair, name), files in pairs.items() for source, target in files
           for spec in shards.plan_aligned(f'{pair}_{name}', source, target, options.shard_pairs, fingerprint,
                                           pair.split('-')[0])]
  job = shard_writer.ShardJob(str(out_dir), str(directory / 'tokenizer'), tokenizer.fingerprint(),
                              batch_lines=options.batch_lines, task='translation')
  entries, skipped, report = lm_prepare.run_shards(specs, out_dir, job, options)
  skipped_sources = {f['path'] for f in skipped}
  empty = [f'{pair} {name}' for pair, name in pairs 
           if not sum(e['num_lines'] for e in entries.get(f'{pair}_{name}', []))]
  if empty:
    raise text.BadCorpusError(f'no sentence pair left in {", ".join(empty)} (their files are empty or were skipped: '
                              f'{sorted(skipped_sources) or "none"}); give each set at least one readable file pair.')
  for (pair, name), files in pairs.items():
    if name != 'train':
      sides = [[], []]
      for spec in (s for s in specs if s.split == f'{pair}_{name}' and s.path not in skipped_sources):
        for source, target in shards.iter_aligned_pairs(spec):
          sides[0].append(source)
          sides[1].append(target)
      for side, lines in zip(('src', 'ref'), sides):
        _write_if_changed(directory / f'{pair}.{name}.{side}.txt', tuple(lines))
  manifest = {'format': 'shards', 'settings': settings, 'tokenizer_md5': tokenizer.fingerprint(),
              'sets': {pair: [n for p, n in pairs if p == pair] for pair in settings['pairs']},
              'shards': {pair: {n: [e['file'] for e in entries.get(f'{p}_{n}', [])] for p, n in pairs if p == pair}
                         for pair in settings['pairs']},
              'sizes': {pair: {n: sum(e['num_lines'] for e in entries.get(f'{p}_{n}', [])) for p, n in pairs
                               if p == pair} for pair in settings['pairs']},
              'skipped_files': skipped}
  report['pairs'] = manifest['sizes']
  lm_prepare.write_json(directory / 'prepare_report.json', report)
  lm_prepare.write_json(directory / translation.MANIFEST, manifest)  # Last: main reads what it lists.
  return report

"""Preparing a language-model corpus at any size (`python -m stablemoe_jax.prepare`, `stablemoe_jax/prepare.py`).

Prepares what `main` trains on, into `DIR/data` (the workdir `main` is then run
with): the tokenizer in `DIR/data/tokenizer`, the tokenized shards in
`DIR/data/shards/{split}/` (layout in `shard_writer`), and the manifest
`DIR/data/prepared.json` that `main` reads (see `grain_reader`):

    {format: 'shards', corpus, tokenizer, [sentencepiece_vocab_size], vocab_size,
     tokenizer_fingerprint, token_dtype, chunk_tokens, inputs: {split: [file identity]},
     shards: {split: [{file, num_tokens, num_lines}]}, skipped_files: [{path, error}]}

Inputs, from the config's `data` section: `corpus='ptb'` / `'text'` as for
`main`, or `corpus='files'` with `train_files`, `valid_files`, `test_files`
(comma-separated globs of plain text, `.gz` or `.zst`), and optionally
`tokenizer_files` (globs of the train files the tokenizer is built from;
default: all of them) and `eval_sets` (named held-out sets, written as the
extra splits `valid@NAME` / `test@NAME`; `data/lm/eval_sets.py`). How to prepare is given by flags (`Options`): shard
size, tokens per record, the sentencepiece sample, workers, the Beam runner.

Steps: tokenizer (trained once, in this process) -> plan (shards of every
split) -> one task per shard on Beam (`beam_pipeline`) -> manifest. Re-running
skips the shards already done, so a killed preparation resumes; a shard's name
carries the fingerprint of its input and of every setting, so a changed
input, tokenizer or setting is redone. Shards that are not part of the current
plan are deleted at the end. One preparation at a time per workdir.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pathlib
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import sentencepiece as spm
import tqdm

from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.common import locate
from stablemoe_jax.data.common import shards
from stablemoe_jax.data.common import text
from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.lm import prepared
from stablemoe_jax.data.prepare import beam_pipeline
from stablemoe_jax.data.prepare import shard_writer
from stablemoe_jax.data.lm.prepared import settings, split_inputs  # noqa: F401  (re-exported)

FORMAT_VERSION = 1

SPLITS = locate.SPLITS


@dataclasses.dataclass(frozen=True)
class Options:
  """How to prepare (flags of the command); none of them changes what a run trains on but the sample size."""

  shard_mb: float = 64.0  # plain-text MiB per shard
  shard_pairs: int = 500_000  # translation: sentence pairs per shard
  chunk_tokens: int = 4096  # tokens per record
  sentencepiece_sample_lines: int = 1_000_000  # the tokenizer's training sample
  batch_lines: int = 8192  # lines a worker tokenizes at once (its memory)
  workers: int = 1  # Beam worker processes on this machine; 0: no Beam
  skip_bad_files: bool = False
  beam_args: str = ''
  progress: bool = True

  @property
  def shard_bytes(self) -> int:
    return max(int(self.shard_mb * (1 << 20)), 1)


def inputs_identity(files: Mapping[str, list[pathlib.Path]]) -> dict[str, list[str]]:
  return {split: [shards.file_identity(p) for p in paths] for split, paths in files.items()}


def train_on_lines(train, lines):
  """`train(lines)`, where a `BadCorpusError` raised while a C++ trainer (sentencepiece) pulls the lines comes
  back as itself (one line naming file and line), not wrapped in sentencepiece's RuntimeError."""
  error: list[text.BadCorpusError] = []

  def checked():
    try:
      yield from lines
    except text.BadCorpusError as bad:
      error.append(bad)
      raise

  try:
    return train(checked())
  except RuntimeError:
    if error:
      raise error[0] from None
    raise


def _train_sentencepiece(lines, vocab_size: int, sample_lines: int) -> tokenizers.SentencePieceTokenizer:
  """sentencepiece on its seeded reservoir sample of at most `sample_lines` lines (memory ~ the sample)."""
  spm.set_random_generator_seed(0)
  writer = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=lines, model_writer=writer, vocab_size=vocab_size, model_type='unigram',
      character_coverage=1.0, input_sentence_size=sample_lines, shuffle_input_sentence=True, num_threads=1,
      unk_id=0, eos_id=1, bos_id=-1, pad_id=-1, minloglevel=2)
  return tokenizers.SentencePieceTokenizer(writer.getvalue())


def prepare_tokenizer(config: Mapping[str, Any], train_files: list[pathlib.Path], out_dir: pathlib.Path,
                      sample_lines: int, progress: bool = False) -> tokenizers.Tokenizer:
  """The tokenizer in `out_dir` if it was built from these inputs and settings, else a new one (saved).

  `config`: `settings(...)`; `sample_lines`: sentencepiece's training sample (ignored for 'word'). Building
  reads every train line once in this process (1B tokens: 65 s, see docs/speed.md).
  """
  identity = '\n'.join(shards.file_identity(p) for p in train_files)
  meta = dict(config, kind=config['tokenizer'], train_inputs=hashlib.sha256(identity.encode()).hexdigest())
  if config['tokenizer'] == 'sentencepiece':
    meta['sample_lines'] = sample_lines
  meta_path = out_dir / tokenizers.META_FILE
  if meta_path.is_file():
    saved = json.loads(meta_path.read_text())
    if all(saved.get(k) == v for k, v in meta.items()):
      return tokenizers.load_tokenizer(out_dir)
    meta_path.unlink()  # Built from other inputs or settings: rebuilt below, the old shards are not reused.
  lines = iter(tqdm.tqdm(shards.iter_lines(shards.plan_split('train', train_files, 1 << 62, '')), desc='tokenizer',
                         unit=' lines', unit_scale=True, mininterval=2.0, disable=not progress, file=sys.stderr))
  if config['tokenizer'] == 'word':
    tokenizer = tokenizers.WordTokenizer.from_lines(lines)
  else:
    tokenizer = train_on_lines(lambda checked: _train_sentencepiece(checked, config['sentencepiece_vocab_size'],
                                                                    sample_lines), lines)
  tokenizer.save(out_dir)
  meta['vocab_size'] = tokenizer.vocab_size
  write_json(meta_path, meta)  # Written last: a directory with tokenizer.json holds a complete tokenizer.
  return tokenizer


class Progress:
  """A progress bar fed by polling the shards' done markers (works with any runner on a shared disk)."""

  def __init__(self, specs: list[shards.ShardSpec], out_dir: pathlib.Path, enabled: bool = True):
    self._pending = {s.name: s for s in specs if not shard_writer.done_path(out_dir, s).exists()}
    self._out_dir = out_dir
    self._bar = tqdm.tqdm(total=sum(s.num_bytes for s in self._pending.values()), unit='B', unit_scale=True,
                          desc='prepare', dynamic_ncols=True, mininterval=1.0, disable=not enabled, file=sys.stderr)
    self._total = len(specs)
    self._done = len(specs) - len(self._pending)
    self.tokens = 0
    self._started = time.time()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._poll, daemon=True)

  def _update(self) -> None:
    for name, spec in list(self._pending.items()):
      done = shard_writer.done_path(self._out_dir, spec)
      if done.exists() or shard_writer.bad_path(self._out_dir, spec).exists():
        del self._pending[name]
        self._done += 1
        self.tokens += json.loads(done.read_text())['num_tokens'] if done.exists() else 0
        self._bar.update(spec.num_bytes)
    rate = self.tokens / max(time.time() - self._started, 1e-9)
    self._bar.set_postfix_str(f'shards {self._done}/{self._total}, {rate / 1e6:.2f}M tokens/s', refresh=False)

  def _poll(self) -> None:
    while not self._stop.wait(1.0):
      self._update()

  def __enter__(self) -> Progress:
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()
    self._update()
    self._bar.close()


def _collect(specs: list[shards.ShardSpec], out_dir: pathlib.Path, skip_bad_files: bool
             ) -> tuple[dict[str, list[dict]], list[dict]]:
  """({split: [shard entries]}, skipped files) after the run; raises on a bad shard unless skipping."""
  bad = {}
  for spec in specs:
    path = shard_writer.bad_path(out_dir, spec)
    if path.exists() and not shard_writer.done_path(out_dir, spec).exists():
      bad.setdefault(spec.path, json.loads(path.read_text())['error'])
  if bad and not skip_bad_files:
    first = next(iter(bad.values()))
    more = f' ({len(bad) - 1} more bad file(s))' if len(bad) > 1 else ''
    raise text.BadCorpusError(first + more)
  missing = [s.name for s in specs if s.path not in bad and not shard_writer.done_path(out_dir, s).exists()]
  if missing:
    raise RuntimeError(f'{len(missing)} shard(s) were not written (first: {missing[0]}); run the command again.')
  entries: dict[str, list[dict]] = {}
  for spec in specs:
    if spec.path in bad:
      continue
    stats = json.loads(shard_writer.done_path(out_dir, spec).read_text())
    entries.setdefault(spec.split, []).append(
        {'file': str(shard_writer.records_path(out_dir, spec).relative_to(out_dir.parent)),
         'num_tokens': stats['num_tokens'], 'num_lines': stats['num_lines']})
  return entries, [{'path': p, 'error': e} for p, e in bad.items()]


def _remove_stale(out_dir: pathlib.Path, specs: list[shards.ShardSpec]) -> int:
  """Deletes every file under out_dir/{split} not belonging to a planned shard (and temporary files)."""
  keep = {s.name for s in specs}
  removed = 0
  for path in out_dir.glob('*/*'):
    if path.name.split('.')[0] not in keep or '.tmp.' in path.name:
      path.unlink()
      removed += 1
  return removed


def prepare(data: LMDataSettings, prepared_dir: pathlib.Path, options: Options = Options()) -> dict:
  """Prepares tokenizer, shards and manifest of the run's `data` settings in `prepared_dir`; returns the report
  (also `prepare_report.json`).

  Raises:
    EmptyInputError: a glob matches nothing; BadCorpusError: a bad input file
      (unless `options.skip_bad_files`) or a split without text; DataNotFoundError: no corpus.
  """
  started = time.time()
  config = settings(data)
  files = split_inputs(data)
  prepared_dir = pathlib.Path(prepared_dir)
  out_dir = prepared_dir / 'shards'
  tokenizer_files = files['train']
  subset = data.tokenizer_files
  if subset:  # A subset of the train files, so the driver reads less.
    tokenizer_files = shards.expand_inputs(subset, 'data.tokenizer_files')
  try:
    tokenizer = prepare_tokenizer(config, tokenizer_files, prepared_dir / 'tokenizer', options.sentencepiece_sample_lines,
                                  options.progress)
  except text.BadCorpusError:
    good = [p for p in tokenizer_files if _readable(p)]
    if not options.skip_bad_files or not good:
      raise
    tokenizer = prepare_tokenizer(config, good, prepared_dir / 'tokenizer', options.sentencepiece_sample_lines,
                                  options.progress)
  dtype = shard_writer.token_dtype(tokenizer.vocab_size)
  fingerprint = hashlib.sha256(json.dumps(
      [FORMAT_VERSION, tokenizer.kind, tokenizer.fingerprint(), dtype, options.chunk_tokens]).encode()).hexdigest()
  specs = [spec for split in files for spec in shards.plan_split(split, files[split], options.shard_bytes, fingerprint)]
  job = shard_writer.ShardJob(str(out_dir), str(prepared_dir / 'tokenizer'), tokenizer.fingerprint(),
                              options.chunk_tokens, dtype, options.batch_lines)
  entries, skipped, report = run_shards(specs, out_dir, job, options, started)
  for split in files:  # train, valid, test, then data.eval_sets' splits
    if not sum(e['num_tokens'] for e in entries.get(split, [])):
      raise text.BadCorpusError(f'The {split} split has no text (inputs: {", ".join(map(str, files[split]))}).')
  manifest = dict(config, format=prepared.SHARDS_FORMAT, vocab_size=tokenizer.vocab_size,
                  tokenizer_fingerprint=tokenizer.fingerprint(), token_dtype=dtype,
                  chunk_tokens=options.chunk_tokens, inputs=inputs_identity(files), shards=entries,
                  skipped_files=skipped)
  write_json(prepared_dir / prepared.MANIFEST, manifest)
  write_json(prepared_dir / 'prepare_report.json', report)
  return report


def run_shards(specs: list[shards.ShardSpec], out_dir: pathlib.Path, job: shard_writer.ShardJob, options: Options,
               started: float | None = None) -> tuple[dict[str, list[dict]], list[dict], dict]:
  """Writes the pending shards of `specs` on Beam, checks them, removes stale files (both tasks).

  Returns ({split: [{file, num_tokens, num_lines}]}, skipped files, the report: shards written / reused,
  tokens per split, seconds, tokens/s).
  """
  started = time.time() if started is None else started
  for spec in specs:  # Retry shards that failed before.
    shard_writer.bad_path(out_dir, spec).unlink(missing_ok=True)
  pending = [s for s in specs if not shard_writer.done_path(out_dir, s).exists()]
  reused = len(specs) - len(pending)
  with Progress(specs, out_dir, enabled=options.progress) as bar:
    beam_pipeline.run(pending, job, options.workers, options.beam_args)
  entries, skipped = _collect(specs, out_dir, options.skip_bad_files)
  removed = _remove_stale(out_dir, specs)
  seconds = time.time() - started
  bad_files = {f['path'] for f in skipped}
  report = {'shards': len(specs), 'shards_reused': reused, 'skipped_files': skipped,
            'shards_written': sum(s.path not in bad_files for s in specs) - reused,
            'tokens': {split: sum(e['num_tokens'] for e in entries.get(split, [])) for split in entries},
            'stale_files_removed': removed, 'tokens_written': bar.tokens, 'seconds': round(seconds, 2),
            'tokens_per_second': round(bar.tokens / seconds), 'workers': options.workers}
  return entries, skipped, report


def _readable(path: pathlib.Path) -> bool:
  try:
    for _ in shards.iter_lines(shards.plan_split('train', [path], 1 << 62, '')):
      pass
    return True
  except text.BadCorpusError:
    return False


def write_json(path: pathlib.Path, value: dict) -> None:
  tmp = path.with_name(path.name + '.tmp')
  tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + '\n')
  tmp.replace(path)

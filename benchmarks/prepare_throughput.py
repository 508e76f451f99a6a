"""Preparation throughput: tokens/s per Beam worker (word and sentencepiece) and the speed-up from 1 to N workers.

For each tokenizer, the tokenizer is built once (not timed), then the shards are prepared from scratch with
each worker count; per worker = tokens / the workers' summed shard seconds (from the shards' done markers),
wall = the whole Beam run, start-up included. One JSON line per run:

  python -m benchmarks.prepare_throughput --inputs '/tmp/corpus/part-0000*.txt' --valid /tmp/corpus/valid.txt \
    --test /tmp/corpus/test.txt --workdir /tmp/prep_bench --workers 1,2 [--out benchmarks/results/x.jsonl]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import time

from benchmarks.json_lines import JsonLines
from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.prepare import lm as prepare


def data_settings(inputs: str, valid: str, test: str, tokenizer: str, vocab: int) -> LMDataSettings:
  return LMDataSettings(corpus='files', data_dir='', tokenizer=tokenizer, sentencepiece_vocab_size=vocab,
                        train_files=inputs, valid_files=valid, test_files=test)


def run(data, prepared_dir: pathlib.Path, options: prepare.Options, prepare_fn=prepare.prepare,
        shards_dir: str = 'shards') -> dict:
  """Prepares the shards of the `data` settings from scratch (`prepare_fn`, the tokenizer kept); throughput from
  their done markers."""
  shutil.rmtree(prepared_dir / shards_dir, ignore_errors=True)
  started = time.time()
  report = prepare_fn(data, prepared_dir, options)
  wall = time.time() - started
  stats = [json.loads(p.read_text()) for p in (prepared_dir / shards_dir).glob('*/*.json')]
  tokens, lines = sum(s['num_tokens'] for s in stats), sum(s['num_lines'] for s in stats)
  busy = sum(s['seconds'] for s in stats)
  return {'workers': options.workers, 'shards': report['shards'], 'tokens': tokens, 'lines': lines,
          'wall_s': round(wall, 2), 'tokens_per_s_wall': round(tokens / wall), 'worker_busy_s': round(busy, 2),
          'tokens_per_s_per_worker': round(tokens / busy), 'lines_per_s_per_worker': round(lines / busy),
          'max_lines_held': max(s['max_lines_held'] for s in stats)}


def run_worker_counts(results: JsonLines, workers: str, fields: dict, data, prepared_dir: pathlib.Path,
                      options: prepare.Options, *run_args) -> None:
  """`run` with each of the comma-separated worker counts; the speed-up is against the first."""
  base = None
  for count in map(int, workers.split(',')):
    result = dict(fields, **run(data, prepared_dir, dataclasses.replace(options, workers=count), *run_args))
    base = base or result['wall_s']
    result['speedup_vs_first'] = round(base / result['wall_s'], 2)
    results.add(result)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--inputs', required=True)
  parser.add_argument('--valid', required=True)
  parser.add_argument('--test', required=True)
  parser.add_argument('--workdir', type=pathlib.Path, required=True)
  parser.add_argument('--workers', default='1,2')
  parser.add_argument('--tokenizers', default='word,sentencepiece')
  parser.add_argument('--vocab', type=int, default=8000)
  parser.add_argument('--shard_mb', type=float, default=16)
  parser.add_argument('--out', type=pathlib.Path)
  args = parser.parse_args()
  results = JsonLines(args.out)
  for kind in args.tokenizers.split(','):
    data = data_settings(args.inputs, args.valid, args.test, kind, args.vocab)
    prepared_dir = args.workdir / kind
    options = prepare.Options(shard_mb=args.shard_mb, progress=False)
    started = time.time()
    prepare.prepare_tokenizer(prepare.settings(data), prepare.split_inputs(data)['train'],
                              prepared_dir / 'tokenizer', options.sentencepiece_sample_lines)
    tokenizer_s = time.time() - started
    run_worker_counts(results, args.workers, dict(tokenizer=kind, tokenizer_build_s=round(tokenizer_s, 2)),
                      data, prepared_dir, options)
  results.save()


if __name__ == '__main__':
  main()

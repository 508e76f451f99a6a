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

import ml_collections

from benchmarks.json_lines import JsonLines
from stablemoe_jax.data import prepare


def data_config(inputs: str, valid: str, test: str, tokenizer: str, vocab: int) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(corpus='files', data_dir='', tokenizer=tokenizer, sentencepiece_vocab_size=vocab,
                                        train_files=inputs, valid_files=valid, test_files=test))


def run(config, prepared_dir: pathlib.Path, options: prepare.Options) -> dict:
  shutil.rmtree(prepared_dir / 'shards', ignore_errors=True)
  started = time.time()
  report = prepare.prepare(config, prepared_dir, options)
  wall = time.time() - started
  stats = [json.loads(p.read_text()) for p in (prepared_dir / 'shards').glob('*/*.json')]
  tokens = sum(s['num_tokens'] for s in stats)
  busy = sum(s['seconds'] for s in stats)
  return {'workers': options.workers, 'shards': report['shards'], 'tokens': tokens, 'wall_s': round(wall, 2),
          'tokens_per_s_wall': round(tokens / wall), 'worker_busy_s': round(busy, 2),
          'tokens_per_s_per_worker': round(tokens / busy), 'max_lines_held': max(s['max_lines_held'] for s in stats)}


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
    config = data_config(args.inputs, args.valid, args.test, kind, args.vocab)
    prepared_dir = args.workdir / kind
    options = prepare.Options(shard_mb=args.shard_mb, progress=False)
    started = time.time()
    prepare.prepare_tokenizer(prepare.settings(config), prepare.split_inputs(config)['train'],
                              prepared_dir / 'tokenizer', options.sentencepiece_sample_lines)
    tokenizer_s = time.time() - started
    base = None
    for workers in map(int, args.workers.split(',')):
      result = dict(tokenizer=kind, tokenizer_build_s=round(tokenizer_s, 2),
                    **run(config, prepared_dir, dataclasses.replace(options, workers=workers)))
      base = base or result['wall_s']
      result['speedup_vs_first'] = round(base / result['wall_s'], 2)
      results.add(result)
  results.save()


if __name__ == '__main__':
  main()

"""The translation training iterator (no model) over prepared pair shards against the in-memory `.npz` sets.

Prepares `--config` (default configs/mt_cpu.py: Multi30k de/fr/cs + the Bible, 64 x 64 positions a step) with
`prepare` into `--workdir` (reused when done), then times `MixedPairIterator` batches (in the config's length buckets) of the same seed
from (a) the train sets as `pair_records.RecordSet`s (random access into the array_record shards, what `main`
reads after `prepare`) and (b) the same pairs as in-memory `EncodedSet`s saved to and loaded from `.npz` (what
`main` reads when it prepares the small corpora itself). The two alternate `--rounds` times, `--batches` each;
the best round of each is reported, with their ratio, and the batches are checked equal. One JSON line a reader:

  STABLEMOE_DATA_DIR=../shared/data python -m benchmarks.mt_reader --workdir /work/exp_mtreader \
    [--batches 200] [--rounds 3] [--out benchmarks/results/corpora/mt_reader.jsonl]

Target tokens = the batch's scored target positions (`weights`, eos included).
"""
from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

from benchmarks.json_lines import JsonLines
from stablemoe_jax.data.prepare import lm as prepare
from stablemoe_jax.data.prepare import translation as prepare_translation
from stablemoe_jax.data.translation import pipeline as data_lib


def _load_config(path: str):
  import importlib.util
  spec = importlib.util.spec_from_file_location('bench_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def write_npz(record_sets, directory: pathlib.Path) -> None:
  """The record sets' pairs as the `.npz` files main writes for its in-memory sets."""
  directory.mkdir(parents=True, exist_ok=True)
  for s in record_sets:
    rows = s.pairs(range(len(s)))
    data_lib._save_set(directory, data_lib.EncodedSet(s.pair, s.name, *data_lib._flatten([r[0] for r in rows]),
                                                      *data_lib._flatten([r[1] for r in rows])))


def time_round(sets, config, batches: int) -> tuple[float, int, list]:
  """(seconds, target tokens, the first 3 batches) of `batches` batches after one warm-up batch."""
  train = config.train
  buckets = data_lib.length_buckets(config.data.get('length_buckets', 1), train.seq_len)
  it = data_lib.MixedPairIterator(sets, train.batch_size, train.seq_len, config.seed, config.data.sampling_temperature,
                                  length_buckets=buckets)
  first = [next(it)]
  tokens = 0
  started = time.perf_counter()
  for _ in range(batches):
    batch = next(it)
    tokens += int(batch['weights'].sum())
    if len(first) < 3:
      first.append(batch)
  return time.perf_counter() - started, tokens, first


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', type=pathlib.Path, required=True)
  parser.add_argument('--config', default='configs/mt_cpu.py')
  parser.add_argument('--batches', type=int, default=200)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--workers', type=int, default=0, help='Beam workers for the preparation (0: inline).')
  parser.add_argument('--out', type=pathlib.Path)
  args = parser.parse_args()
  config = _load_config(args.config)
  prepared_dir = args.workdir / 'data'
  started = time.time()
  report = prepare_translation.prepare(config.data, prepared_dir, prepare.Options(workers=args.workers,
                                                                                  progress=False))
  prepare_s = time.time() - started
  started = time.perf_counter()
  data = data_lib.load_translation_data(config.data, prepared_dir)
  records = data.split_sets('train')
  open_s = time.perf_counter() - started
  write_npz(records, args.workdir / 'npz')
  started = time.perf_counter()
  in_memory = [data_lib._load_set(args.workdir / 'npz', s.pair, s.name) for s in records]
  npz_s = time.perf_counter() - started
  best = {'shards': (float('inf'), 0), 'npz': (float('inf'), 0)}
  firsts = {}
  for _ in range(args.rounds):
    for name, sets in (('shards', records), ('npz', in_memory)):
      seconds, tokens, first = time_round(sets, config, args.batches)
      best[name] = min(best[name], (seconds, tokens))
      firsts[name] = first
  for a, b in zip(firsts['shards'], firsts['npz']):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  results = JsonLines(args.out)
  rates = {name: (args.batches / s, t / s) for name, (s, t) in best.items()}
  pairs = sum(len(s) for s in records)
  for name in ('shards', 'npz'):
    results.add({'reader': name, 'config': args.config, 'batch_size': config.train.batch_size,
                 'seq_len': config.train.seq_len, 'length_buckets': config.data.get('length_buckets', 1),
                 'train_pairs': pairs, 'batches': args.batches,
                 'rounds': args.rounds, 'seconds': round(best[name][0], 3),
                 'batches_per_s': round(rates[name][0], 1), 'target_tokens_per_s': round(rates[name][1]),
                 'shards_over_npz': round(rates['shards'][0] / rates['npz'][0], 3),
                 'open_s': round(open_s if name == 'shards' else npz_s, 2),
                 'prepare_s': round(prepare_s, 1), 'shards_reused': report['shards_reused'],
                 'same_batches': True})
  results.save()


if __name__ == '__main__':
  main()

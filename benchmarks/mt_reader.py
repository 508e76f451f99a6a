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

`--batch_config` takes the batch shapes (batch size, length, buckets, seed, temperature) from another config than
the data's, e.g. configs/mt_paper.py's 2,048 x 256 positions in 3 buckets (8,192 rows of 64 at the shortest) over
mt_cpu's prepared pairs. `--row_batches N` (default 10) then times `make_rows` on N drawn batches a reader against
the per-row loop it replaced (tests/data/translation/test_mt_rows.py's reference, same picks, batches checked equal), and the whole
iterator (draw + make_rows) against the per-row draw and loop, in rows/s, against the rows/s a GPU step needs at the
shortest bucket:
`--gpu_tokens_per_s` (default 339,200: dense lm_base on one H100, docs/speed.md) / that bucket's length.
"""
from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

from benchmarks.json_lines import JsonLines
from stablemoe_jax.core import settings
from stablemoe_jax.data.prepare import lm as prepare
from stablemoe_jax.data.prepare import translation as prepare_translation
from stablemoe_jax.data.translation import batches as batch_lib
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
    data_lib._save_set(directory, batch_lib.EncodedSet(s.pair, s.name, *batch_lib._flatten([r[0] for r in rows]),
                                                       *batch_lib._flatten([r[1] for r in rows])))


def time_round(sets, config, batches: int) -> tuple[float, int, list]:
  """(seconds, target tokens, the first 3 batches) of `batches` batches after one warm-up batch."""
  train = config.train
  data = settings.typed(settings.TranslationDataSettings, config.data)
  buckets = batch_lib.length_buckets(data.length_buckets, train.seq_len)
  it = batch_lib.MixedPairIterator(sets, train.batch_size, train.seq_len, config.seed, data.sampling_temperature,
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


def _loop_reference():
  """The per-row ``make_rows`` and ``MixedPairIterator.draw`` of before issue 40, kept in tests/data/translation/test_mt_rows.py."""
  import importlib.util
  import sys
  tests = pathlib.Path(__file__).resolve().parents[1] / 'tests'
  sys.path.insert(0, str(tests))
  spec = importlib.util.spec_from_file_location('mt_rows_reference', tests / 'test_mt_rows.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.loop_make_rows, module.loop_draw


def _best(fn, calls: list[tuple], rounds: int) -> float:
  """Best of `rounds` of `fn(*args)` over `calls`; each result is dropped at once, as the training loop drops a
  batch once it is on the device (kept, every new batch's pages would fault in: 10x the allocation's cost)."""
  times = []
  for _ in range(rounds):
    started = time.perf_counter()
    for args in calls:
      fn(*args)
    times.append(time.perf_counter() - started)
  return min(times)


def _sized(draw: tuple[list, int]) -> tuple[list, int, int]:
  picks, length = draw
  return picks, len(picks), length


def time_make_rows(sets, config, batches: int, rounds: int, gpu_tokens_per_s: float) -> dict:
  """make_rows (NumPy, on the iterator's `Picks`; also on (set, index) pairs, as evaluation calls it) against the
  per-row loop (on the pairs the old draw built) on the same `batches` drawn batches; the whole iterator's rows/s."""
  train = config.train
  data = settings.typed(settings.TranslationDataSettings, config.data)
  buckets = batch_lib.length_buckets(data.length_buckets, train.seq_len)
  make = lambda: batch_lib.MixedPairIterator(sets, train.batch_size, train.seq_len, config.seed,
                                             data.sampling_temperature, length_buckets=buckets)
  it = make()
  draws = [it.draw() for _ in range(batches)]
  rows = sum(len(picks) for picks, _ in draws)
  loop, loop_draw = _loop_reference()
  for picks, length in draws:
    new, old = batch_lib.make_rows(picks, len(picks), length), loop(picks.pairs(), len(picks), length)
    for key in old:
      np.testing.assert_array_equal(new[key], old[key])
  numpy_s = _best(batch_lib.make_rows, [(p, len(p), n) for p, n in draws], rounds)
  pairs = [(picks.pairs(), len(picks), length) for picks, length in draws]  # the loop's input: the old draw's
  loop_s = _best(loop, pairs, rounds)
  from_pairs_s = _best(batch_lib.make_rows, pairs, rounds)
  batch_numbers = [(k,) for k in range(batches)]  # the drawn batches again
  draw_s = _best(lambda k: it.set_state({'batches': k}) or it.draw(), batch_numbers, rounds)
  iterator_s = _best(lambda k: it.set_state({'batches': k}) or next(it), batch_numbers, rounds)
  loop_iterator_s = _best(lambda k: it.set_state({'batches': k}) or loop(*_sized(loop_draw(it))), batch_numbers,
                          rounds)
  needed = gpu_tokens_per_s / buckets[0]  # rows/s at the shortest bucket, the most rows per position
  return {'rows': rows, 'make_rows_numpy_rows_per_s': round(rows / numpy_s),
          'make_rows_loop_rows_per_s': round(rows / loop_s), 'make_rows_speedup': round(loop_s / numpy_s, 1),
          'make_rows_numpy_from_pairs_rows_per_s': round(rows / from_pairs_s),
          'draw_rows_per_s': round(rows / draw_s), 'iterator_rows_per_s': round(rows / iterator_s),
          'loop_iterator_rows_per_s': round(rows / loop_iterator_s),
          'iterator_speedup': round(loop_iterator_s / iterator_s, 1),
          'gpu_tokens_per_s': gpu_tokens_per_s, 'shortest_bucket': buckets[0],
          'needed_rows_per_s': round(needed), 'iterator_over_needed': round(rows / iterator_s / needed, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', type=pathlib.Path, required=True)
  parser.add_argument('--config', default='configs/mt_cpu.py')
  parser.add_argument('--batch_config', help='Config of the batch shapes (default: --config).')
  parser.add_argument('--row_batches', type=int, default=10, help='Batches of the make_rows timing (0: none).')
  parser.add_argument('--gpu_tokens_per_s', type=float, default=339_200.0)
  parser.add_argument('--batches', type=int, default=200)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--workers', type=int, default=0, help='Beam workers for the preparation (0: inline).')
  parser.add_argument('--out', type=pathlib.Path)
  args = parser.parse_args()
  config = _load_config(args.config)
  batch_config = _load_config(args.batch_config) if args.batch_config else config
  prepared_dir = args.workdir / 'data'
  started = time.time()
  data_settings = settings.from_config(config).data
  report = prepare_translation.prepare(data_settings, prepared_dir, prepare.Options(workers=args.workers,
                                                                                    progress=False))
  prepare_s = time.time() - started
  started = time.perf_counter()
  data = data_lib.load_translation_data(data_settings, prepared_dir)
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
      seconds, tokens, first = time_round(sets, batch_config, args.batches)
      best[name] = min(best[name], (seconds, tokens))
      firsts[name] = first
  for a, b in zip(firsts['shards'], firsts['npz']):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  results = JsonLines(args.out)
  rates = {name: (args.batches / s, t / s) for name, (s, t) in best.items()}
  pairs = sum(len(s) for s in records)
  for name, sets in (('shards', records), ('npz', in_memory)):
    rows = time_make_rows(sets, batch_config, args.row_batches, args.rounds, args.gpu_tokens_per_s) \
        if args.row_batches else {}
    results.add({'reader': name, 'config': args.config, 'batch_config': args.batch_config or args.config,
                 'batch_size': batch_config.train.batch_size, 'seq_len': batch_config.train.seq_len,
                 'length_buckets': settings.typed(settings.TranslationDataSettings, batch_config.data).length_buckets,
                 'train_pairs': pairs, 'batches': args.batches,
                 'rounds': args.rounds, 'seconds': round(best[name][0], 3),
                 'batches_per_s': round(rates[name][0], 1), 'target_tokens_per_s': round(rates[name][1]),
                 'shards_over_npz': round(rates['shards'][0] / rates['npz'][0], 3),
                 'open_s': round(open_s if name == 'shards' else npz_s, 2),
                 'prepare_s': round(prepare_s, 1), 'shards_reused': report['shards_reused'],
                 'same_batches': True, **rows})
  results.save()


if __name__ == '__main__':
  main()

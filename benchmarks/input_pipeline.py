"""The training input pipeline alone (a fake step: no model), on shards written by `stablemoe_jax.prepare`.

Per setting: tokens/s of `train_iterator` batches [B, S] after a warm-up, for grain's read threads
(`ReadOptions(num_threads, prefetch_buffer_size)`) and optional worker processes (`mp_prefetch`); then the
exact-resume check: state after k batches, a fresh iterator set to it, the next batches compared. One JSON line
per setting:

  python -m benchmarks.input_pipeline --prepared /tmp/prep_bench/sentencepiece --batch 64 --seq_len 1024 \
    --settings 0/0/0,2/8/0,16/500/0,0/0/1 [--in_memory no] [--out benchmarks/results/x.jsonl]

A setting is threads/prefetch/processes.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import grain
from absl import flags
import numpy as np

from benchmarks.json_lines import JsonLines
from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.lm import grain_reader


def iterator(data, batch: int, seq_len: int, threads: int, prefetch: int, processes: int, seed: int = 0):
  it = data.train_iterator(batch, seq_len, seed, read_options=grain.ReadOptions(num_threads=threads,
                                                                                prefetch_buffer_size=prefetch))
  if not processes:
    return it
  from stablemoe_jax.data.lm import pipeline
  ds = pipeline.train_dataset(data.stream('train'), batch, seq_len, seed).to_iter_dataset(
      grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch))
  return iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=processes)))


def measure(data, batch: int, seq_len: int, threads: int, prefetch: int, processes: int, seconds: float) -> dict:
  it = iterator(data, batch, seq_len, threads, prefetch, processes)
  for _ in range(5):
    next(it)
  count, checksum, started = 0, 0, time.perf_counter()
  while time.perf_counter() - started < seconds:
    checksum += int(next(it)['inputs'][:, 0].sum())  # The fake step touches the batch.
    count += 1
  elapsed = time.perf_counter() - started
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  resumed = iterator(data, batch, seq_len, threads, prefetch, processes)
  resumed.set_state(state)
  exact = all(np.array_equal(e[k], r[k]) for e in expected for r in [next(resumed)] for k in e)
  return {'threads': threads, 'prefetch': prefetch, 'processes': processes, 'batch': batch, 'seq_len': seq_len,
          'batches': count, 'seconds': round(elapsed, 2), 'tokens_per_s': round(count * batch * seq_len / elapsed),
          'resume_exact': exact, 'state_bytes': len(json.dumps(state))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--prepared', type=pathlib.Path, required=True, help='DIR/data of a prepared workdir')
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--seq_len', type=int, default=1024)
  parser.add_argument('--settings', default='0/0/0,2/8/0,16/500/0')
  parser.add_argument('--seconds', type=float, default=10.0)
  parser.add_argument('--in_memory', choices=('auto', 'yes', 'no'), default='auto')
  parser.add_argument('--out', type=pathlib.Path)
  args = parser.parse_args()
  flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags.
  manifest = json.loads((args.prepared / 'prepared.json').read_text())
  data_settings = LMDataSettings(corpus=manifest['corpus'], tokenizer=manifest['tokenizer'],
                                 sentencepiece_vocab_size=manifest.get('sentencepiece_vocab_size', 0),
                                 data_dir='/nonexistent', train_files='/nonexistent', valid_files='/nonexistent',
                                 test_files='/nonexistent')
  started = time.perf_counter()
  data = grain_reader.load(args.prepared, data_settings, {'auto': None, 'yes': True, 'no': False}[args.in_memory])
  stream = data.stream('train')
  opened = {'train_tokens': len(stream), 'records': stream.num_records, 'in_memory': stream.in_memory,
            'open_s': round(time.perf_counter() - started, 2)}
  results = JsonLines(args.out)
  results.add(opened)
  for setting in args.settings.split(','):
    threads, prefetch, processes = map(int, setting.split('/'))
    results.add(measure(data, args.batch, args.seq_len, threads, prefetch, processes, args.seconds))
  results.save()


if __name__ == '__main__':
  main()

"""Translation preparation throughput: sentence pairs/s and tokens/s per Beam worker on Multi30k + Bible, repeated.

Builds a data folder under `--workdir` whose training files are the shared corpora's repeated `--repeat`
times (Multi30k's train.{de,fr,cs,en}; the Bible's verses, keys included, so its held-out books repeat too),
prepares it once (the joint tokenizer: not timed), then the pair shards from scratch with each worker count.
Per worker = pairs (tokens) / the workers' summed shard seconds; wall = the whole Beam run. One JSON line a run:

  python -m benchmarks.prepare_translation_throughput --workdir /work/exp_mtshards --repeat 10 --workers 1,2 \
    [--out benchmarks/results/corpora/prepare_translation_throughput.jsonl]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import time

from benchmarks.json_lines import JsonLines
from benchmarks.prepare_throughput import run_worker_counts
from configs import mt_cpu
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.data.prepare import lm as prepare
from stablemoe_jax.data.prepare import translation as prepare_translation


def repeated_corpora(source: pathlib.Path, out: pathlib.Path, repeat: int) -> None:
  (out / 'multi30k').mkdir(parents=True, exist_ok=True)
  (out / 'bible_es_en').mkdir(parents=True, exist_ok=True)
  for path in sorted((source / 'multi30k').iterdir()):
    times = repeat if path.name.startswith('train.') else 1
    (out / 'multi30k' / path.name).write_bytes(path.read_bytes() * times)
  for name in ('bible.es', 'bible.en', 'keys.txt'):
    (out / 'bible_es_en' / name).write_bytes((source / 'bible_es_en' / name).read_bytes() * repeat)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', type=pathlib.Path, required=True)
  parser.add_argument('--repeat', type=int, default=10)
  parser.add_argument('--workers', default='1,2')
  parser.add_argument('--shard_pairs', type=int, default=50_000)
  parser.add_argument('--out', type=pathlib.Path)
  args = parser.parse_args()
  corpora = args.workdir / 'corpora'
  repeated_corpora(pathlib.Path(os.environ['STABLEMOE_DATA_DIR']), corpora, args.repeat)
  config = mt_cpu.get_config()
  config.data.data_dir = str(corpora)
  data = from_config(config).data
  options = prepare.Options(shard_pairs=args.shard_pairs, workers=0, progress=False)
  prepared_dir = args.workdir / 'data'
  started = time.time()
  prepare_translation.prepare(data, prepared_dir, options)  # Tokenizer, Bible files and a first pass.
  first_s = time.time() - started
  results = JsonLines(args.out)
  run_worker_counts(results, args.workers, dict(task='translation', repeat=args.repeat,
                                                first_prepare_s=round(first_s, 2)),
                    data, prepared_dir, options, prepare_translation.prepare, 'translation/shards')
  results.save()


if __name__ == '__main__':
  main()

"""kill -9 in the middle of a preparation, then the same command again, against an uninterrupted preparation.

Runs `python -m stablemoe_jax.prepare ARGS --workdir W/reference`, then the same into W/killed, sends
SIGKILL to its whole process group (driver and Beam workers) once `--kill_after` shards are done, runs it
again, and prints one JSON line: shards done at the kill, shards reused / written by the rerun, whether the
shards finished before the kill were left untouched, and whether every array_record file and the manifest's
shard list are byte-identical to the reference.

  python -m benchmarks.kill_resume --workdir /tmp/kill --kill_after 20 -- --config configs/lm_files.py \
    --config.data.tokenizer=word --config.data.train_files='/tmp/corpus/part-000[0-4]?.txt' \
    --config.data.valid_files=/tmp/corpus/valid.txt --config.data.test_files=/tmp/corpus/test.txt --workers 2
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from benchmarks.json_lines import JsonLines


def records(data: pathlib.Path) -> dict[str, bytes]:
  out = {str(p.relative_to(data)): p.read_bytes() for p in sorted(data.glob('shards/*/*.array_record'))}
  out['manifest shards'] = json.dumps(json.loads((data / 'prepared.json').read_text())['shards']).encode()
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', type=pathlib.Path, required=True)
  parser.add_argument('--kill_after', type=int, default=10)
  parser.add_argument('--out', type=pathlib.Path)
  parser.add_argument('args', nargs=argparse.REMAINDER)
  args = parser.parse_args()
  command = [sys.executable, '-m', 'stablemoe_jax.prepare'] + [a for a in args.args if a != '--']
  started = time.time()
  subprocess.run(command + [f'--workdir={args.workdir / "reference"}'], check=True, capture_output=True)
  reference_s = time.time() - started
  killed = args.workdir / 'killed'
  process = subprocess.Popen(command + [f'--workdir={killed}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
  while len(list(killed.glob('data/shards/*/*.json'))) < args.kill_after and process.poll() is None:
    time.sleep(0.1)
  os.killpg(process.pid, signal.SIGKILL)
  process.wait()
  time.sleep(1.0)
  finished = {p: p.stat().st_mtime_ns for p in killed.glob('data/shards/*/*.array_record')
              if p.with_suffix('.json').exists()}
  leftovers = len(list(killed.glob('data/shards/*/*.tmp.*')))
  started = time.time()
  run = subprocess.run(command + [f'--workdir={killed}'], check=True, capture_output=True, text=True)
  rerun_s = time.time() - started
  report = json.loads(run.stdout.strip().splitlines()[-1])
  result = {'shards': report['shards'], 'done_at_kill': len(finished), 'temporary_files_at_kill': leftovers,
            'rerun_reused': report['shards_reused'], 'rerun_written': report['shards_written'],
            'finished_untouched': all(p.stat().st_mtime_ns == t for p, t in finished.items()),
            'byte_identical': records(killed / 'data') == records(args.workdir / 'reference' / 'data'),
            'reference_s': round(reference_s, 1), 'rerun_s': round(rerun_s, 1)}
  results = JsonLines(args.out)
  results.add(result)
  results.save()


if __name__ == '__main__':
  main()

"""Runs a command and reports its wall time and the peak resident memory of its whole process tree.

  python -m benchmarks.peak_memory [--interval 0.5] -- python -m stablemoe_jax.prepare ...

Samples every `interval` seconds the summed RSS of the command and all its descendants (Beam's worker
processes included) and prints one JSON line: {seconds, peak_rss_sum_mib, peak_rss_single_mib, returncode}.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import psutil


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--interval', type=float, default=0.5)
  parser.add_argument('command', nargs=argparse.REMAINDER)
  args = parser.parse_args()
  command = args.command[1:] if args.command[:1] == ['--'] else args.command
  started = time.time()
  process = subprocess.Popen(command)
  root = psutil.Process(process.pid)
  peak_sum = peak_single = 0
  while process.poll() is None:
    try:
      rss = [p.memory_info().rss for p in [root] + root.children(recursive=True)]
    except psutil.Error:
      rss = []
    peak_sum, peak_single = max(peak_sum, sum(rss)), max([peak_single] + rss)
    time.sleep(args.interval)
  print(json.dumps({'seconds': round(time.time() - started, 1), 'peak_rss_sum_mib': round(peak_sum / 2**20),
                    'peak_rss_single_mib': round(peak_single / 2**20), 'returncode': process.returncode}),
        file=sys.stderr, flush=True)
  sys.exit(process.returncode)


if __name__ == '__main__':
  main()

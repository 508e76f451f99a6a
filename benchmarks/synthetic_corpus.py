"""A synthetic corpus of any size from the shared corpora: PTB train + the botchan novel, repeated, shuffled.

Part i (`part-{i:05d}.txt`) holds every non-empty line of `ptb/ptb.train.txt` and `botchan/botchan.txt`
(46,356 lines, ~1.0M words), in an order shuffled with seed i; `valid.txt` / `test.txt` are PTB's.
Write it outside the repository (it is GBs):

  python -m benchmarks.synthetic_corpus --data_dir ../shared/data --out /tmp/corpus --parts 1100
"""
from __future__ import annotations

import argparse
import pathlib
import shutil

import numpy as np

from stablemoe_jax.data.common import text


def write(data_dir: pathlib.Path, out: pathlib.Path, parts: int) -> None:
  lines = [line + '\n' for name in ('ptb/ptb.train.txt', 'botchan/botchan.txt')
           for line in text.iter_lines(data_dir / name)]
  out.mkdir(parents=True, exist_ok=True)
  for i in range(parts):
    order = np.random.default_rng(i).permutation(len(lines))
    (out / f'part-{i:05d}.txt').write_text(''.join(lines[j] for j in order))
  for split in ('valid', 'test'):
    shutil.copyfile(data_dir / f'ptb/ptb.{split}.txt', out / f'{split}.txt')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--data_dir', type=pathlib.Path, required=True)
  parser.add_argument('--out', type=pathlib.Path, required=True)
  parser.add_argument('--parts', type=int, default=10)
  args = parser.parse_args()
  write(args.data_dir, args.out, args.parts)


if __name__ == '__main__':
  main()

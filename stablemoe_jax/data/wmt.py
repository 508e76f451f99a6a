"""Builds the paper's WMT pairs (fr, cs, de, fi, lv, et, ro, hi, tr -> en) as TFDS records under --tfds_data_dir.

    python -m stablemoe_jax.data.wmt --tfds_data_dir=DIR [--pairs=fr-en,...]

Needs the network and `pip install tensorflow tensorflow-datasets`; DIR is then copied to ``data.tfds_data_dir``
of the training machine. What a run reads of them is ``data/translation/wmt.py``.
"""
from __future__ import annotations

import sys

from stablemoe_jax.data.translation import wmt


def prepare(tfds_data_dir: str, pairs: str = wmt.PAPER_PAIRS) -> None:
  """Downloads and prepares each pair's TFDS builder under ``tfds_data_dir`` (needs the network), as array_record
  (readable without TensorFlow)."""
  import tensorflow_datasets as tfds
  for pair in wmt.parse_wmt_pairs(pairs):
    print(f"preparing {wmt.builder_name(pair)} under {tfds_data_dir}", flush=True)
    tfds.builder(wmt.builder_name(pair), data_dir=tfds_data_dir, file_format="array_record").download_and_prepare()


def main(argv: list[str]) -> int:
  import argparse
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tfds_data_dir", required=True)
  parser.add_argument("--pairs", default=wmt.PAPER_PAIRS)
  args = parser.parse_args(argv)
  try:
    wmt.parse_wmt_pairs(args.pairs)
    prepare(args.tfds_data_dir, args.pairs)
  except Exception as error:  # pylint: disable=broad-except
    # TFDS fails deep in its registry (WMT builders need tensorflow installed) or its download manager (offline).
    first = str(error).splitlines()[0][:200] if str(error) else ""
    print(f"error: preparing WMT failed ({type(error).__name__}: {first}); the TFDS builders "
          f"{', '.join(wmt.builder_name(p) for p in wmt.WMT_BUILDERS)} need `pip install tensorflow tensorflow-datasets` "
          f"and the network (statmt.org and other hosts).", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

"""The paper's WMT setting (fr, cs, de, fi, lv, et, ro, hi, tr -> en) over the public TFDS WMT builders.

``config.data.corpus = "wmt"`` (``configs/mt_wmt.py``) names the pairs; each comes from one TFDS builder
(the WMT year of Wang et al. 2020's multilingual setting, which StableMoE follows). TFDS downloads them from
statmt.org and other hosts, so they are prepared where the network is,

    python -m stablemoe_jax.data.wmt --tfds_data_dir=DIR [--pairs=fr-en,...]

and DIR is then copied to ``data.tfds_data_dir`` of the training machine. Offline, the config is validated and
``--mode=plan`` runs; a run whose TFDS data is not there stops with one line naming the builders to prepare.
"""
from __future__ import annotations

import pathlib
import sys
from typing import Any

from stablemoe_jax.data.locate import DataError, DataNotFoundError

# pair -> (TFDS builder, its config, the version this codebase was written against)
WMT_BUILDERS = {
    "fr-en": ("wmt15_translate", "fr-en", "1.0.0"),
    "cs-en": ("wmt19_translate", "cs-en", "1.0.0"),
    "de-en": ("wmt19_translate", "de-en", "1.0.0"),
    "fi-en": ("wmt19_translate", "fi-en", "1.0.0"),
    "lv-en": ("wmt17_translate", "lv-en", "1.0.0"),
    "et-en": ("wmt18_translate", "et-en", "1.0.0"),
    "ro-en": ("wmt16_translate", "ro-en", "1.0.0"),
    "hi-en": ("wmt14_translate", "hi-en", "1.0.0"),
    "tr-en": ("wmt18_translate", "tr-en", "1.0.0"),
}
PAPER_PAIRS = ",".join(WMT_BUILDERS)


def parse_wmt_pairs(text: str) -> list[str]:
  """``"fr-en,de-en"`` -> the pairs; a pair without a WMT builder here is a ValueError naming the known ones."""
  pairs = [p.strip() for p in str(text).split(",") if p.strip()]
  unknown = [p for p in pairs if p not in WMT_BUILDERS]
  if not pairs or unknown:
    raise ValueError(f"data.pairs={text!r}: {'no pair' if not pairs else 'unknown WMT pair(s) ' + ', '.join(unknown)}; "
                     f"choose from {PAPER_PAIRS}.")
  return pairs


def builder_name(pair: str) -> str:
  """``"fr-en"`` -> ``"wmt15_translate/fr-en:1.0.0"`` (the name ``tfds.builder`` and ``tfds build`` take)."""
  builder, config, version = WMT_BUILDERS[pair]
  return f"{builder}/{config}:{version}"


def prepared_path(tfds_data_dir: pathlib.Path, pair: str) -> pathlib.Path:
  """Where TFDS keeps a prepared builder: ``DIR/<builder>/<config>/<version>``."""
  builder, config, version = WMT_BUILDERS[pair]
  return pathlib.Path(tfds_data_dir) / builder / config / version


def missing_pairs(data_config: Any) -> list[str]:
  """The configured pairs whose TFDS data is not prepared under ``data.tfds_data_dir``."""
  root = data_config.get("tfds_data_dir", "")
  pairs = parse_wmt_pairs(data_config.pairs)
  if not root:
    return pairs
  return [p for p in pairs if not (prepared_path(root, p) / "dataset_info.json").is_file()]


def load_wmt_data(data_config: Any, prepared_dir: pathlib.Path):
  """Stops with one line: what to prepare where the network is, or that reading prepared WMT is not built yet."""
  del prepared_dir
  missing = missing_pairs(data_config)
  if missing:
    root = data_config.get("tfds_data_dir", "") or "<unset: --config.data.tfds_data_dir>"
    raise DataNotFoundError(
        f"WMT data not prepared under data.tfds_data_dir={root}: on a machine with network run "
        f"`python -m stablemoe_jax.data.wmt --tfds_data_dir=DIR --pairs={','.join(missing)}` (TFDS builders "
        f"{', '.join(builder_name(p) for p in missing)}), copy DIR here and set --config.data.tfds_data_dir=DIR.")
  raise DataError("the WMT pairs are prepared, but encoding TFDS WMT records into the translation sets is not "
                  "built yet (data/translation.py reads Multi30k and the Bible only).")


def prepare(tfds_data_dir: str, pairs: str = PAPER_PAIRS) -> None:
  """Downloads and prepares each pair's TFDS builder under ``tfds_data_dir`` (needs the network)."""
  import tensorflow_datasets as tfds
  for pair in parse_wmt_pairs(pairs):
    print(f"preparing {builder_name(pair)} under {tfds_data_dir}", flush=True)
    tfds.builder(builder_name(pair), data_dir=tfds_data_dir).download_and_prepare()


def main(argv: list[str]) -> int:
  import argparse
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tfds_data_dir", required=True)
  parser.add_argument("--pairs", default=PAPER_PAIRS)
  args = parser.parse_args(argv)
  try:
    parse_wmt_pairs(args.pairs)
    prepare(args.tfds_data_dir, args.pairs)
  except Exception as error:  # pylint: disable=broad-except
    # TFDS fails deep in its registry (WMT builders need tensorflow installed) or its download manager (offline).
    first = str(error).splitlines()[0][:200] if str(error) else ""
    print(f"error: preparing WMT failed ({type(error).__name__}: {first}); the TFDS builders "
          f"{', '.join(builder_name(p) for p in WMT_BUILDERS)} need `pip install tensorflow tensorflow-datasets` "
          f"and the network (statmt.org and other hosts).", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

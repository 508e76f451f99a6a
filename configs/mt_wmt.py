"""The paper's WMT setting: fr, cs, de, fi, lv, et, ro, hi, tr -> en (data/wmt.py: one TFDS WMT builder a pair)
on the paper's translation preset (configs/mt_paper.py).

Needs the TFDS data prepared where the network is (``python -m stablemoe_jax.data.wmt --tfds_data_dir=DIR``) and
copied to ``data.tfds_data_dir``; then ``python -m stablemoe_jax.prepare --config configs/mt_wmt.py --workdir W
--config.data.tfds_data_dir=DIR`` writes the tokenizer and pair shards, and ``main`` trains from W. Without the TFDS
data: ``--mode=plan`` runs; preparing or training stops with one line naming what to prepare (exit status 2, before
anything is compiled or written). Routing groups and sample as configs/mt_paper.py: fits 1 to 64 devices.
"""
from configs import mt_paper

from stablemoe_jax.data.translation import wmt


def get_config():
  config = mt_paper.get_config()
  config.data.corpus = "wmt"  # "multi30k_bible" (configs/mt_cpu.py) | "wmt"
  config.data.pairs = wmt.PAPER_PAIRS
  config.data.tfds_data_dir = ""  # where the TFDS WMT builders were prepared
  config.data.sampling_temperature = 5.0  # pairs range from ~1M (hi, lv) to ~40M (fr) sentences; our choice
  return config

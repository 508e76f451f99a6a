"""Every config section is read through its dataclass (``core/settings``): no ``.get(key, default)`` on a config
section anywhere else in the package or the benchmarks, so each default is stated once. Recorded configs (JSON a
checkpoint saved, compared key by key in ``train/checkpoint.py``) are dicts, not sections, and may be read as dicts."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
READERS = ("stablemoe_jax", "benchmarks")
# A name the package gives a config section, then any attribute chain, then .get(
SECTION_GET = re.compile(r"\b(config|cfg|data_config|moe|model|train|section|f\.config)(\.[a-z_]+)*\.get\(")
RECORDED = {"stablemoe_jax/train/checkpoint.py"}  # compares saved configs (dicts)
CONVERSION = "stablemoe_jax/core/settings/"


def test_no_config_section_is_read_with_a_default_outside_the_dataclass_conversion():
  found = []
  for path in sorted(p for folder in READERS for p in (ROOT / folder).rglob("*.py")):
    name = path.relative_to(ROOT).as_posix()
    if name.startswith(CONVERSION) or name in RECORDED:
      continue
    for number, line in enumerate(path.read_text().splitlines(), 1):
      if SECTION_GET.search(line):
        found.append(f"{name}:{number}: {line.strip()}")
  assert not found, "read these through core.settings.typed instead:\n" + "\n".join(found)


def test_the_pattern_catches_the_reads_it_forbids():
  for line in ('corpus = config.data.get("corpus", "ptb")', 'x = data_config.get("pairs", "")',
               'cfg.moe.get("shared_experts", 0)', "f.config.get('task', 'lm')"):
    assert SECTION_GET.search(line), line
  for line in ('summary.get("health")', 'manifest.get("format")', 'os.environ.get("X", "")'):
    assert not SECTION_GET.search(line), line

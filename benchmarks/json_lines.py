"""The corpus benchmarks' output: one JSON line per result, printed as it comes and written to `--out`."""
from __future__ import annotations

import json
import pathlib


class JsonLines:

  def __init__(self, out: pathlib.Path | None):
    self.out = out
    self.lines: list[str] = []

  def add(self, record: dict) -> None:
    self.lines.append(json.dumps(record))
    print(self.lines[-1], flush=True)

  def save(self) -> None:
    if self.out:
      self.out.parent.mkdir(parents=True, exist_ok=True)
      self.out.write_text('\n'.join(self.lines) + '\n')

"""Reading a results table out of a committed document, for the tests that recompute it from the runs."""
from __future__ import annotations

import pathlib


def markdown_rows(path: pathlib.Path, header: str) -> dict[str, list[str]]:
  """``{label: the row's cells after the label}`` of the first table in ``path`` whose header line starts with
  ``header``."""
  lines = path.read_text().splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(header))
  rows = {}
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    label, *cells = [cell.strip() for cell in line.strip("|").split("|")]
    rows[label] = cells
  return rows

"""Reading a results table out of a committed document, for the tests that recompute it from the runs."""
from __future__ import annotations

import json
import pathlib
from typing import Callable

from stablemoe_jax.core.summary import RunSummary


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


def spread_cell(mean: float, std: float, digits: int, seeds: int) -> str:
  """A mean over the reported seeds: "mean ± sample std", or "mean (one seed)" while one is finished."""
  return f"{mean:.{digits}f} ± {std:.{digits}f}" if seeds > 1 else f"{mean:.{digits}f} (one seed)"


def interval_cell(stats: dict, digits: int) -> str:
  """A paired difference's cell: "+mean [+low, +high]" (``paired.interval``'s fields); "+mean (one seed, no
  interval)" while one pair is finished."""
  if stats["low"] is None:
    return f"{stats['mean']:+.{digits}f} (one seed, no interval)"
  return f"{stats['mean']:+.{digits}f} [{stats['low']:+.{digits}f}, {stats['high']:+.{digits}f}]"


def check_rows_are_report(rows: dict[str, list[str]], labels: dict[str, str], report: dict,
                          expected_cells: Callable[[dict, str], list[str]],
                          choice_cell: Callable[[dict | None], str], where: str) -> None:
  """Every row of a document's table (``markdown_rows``) is its method's row in the sweep ``report``: the cells
  ``expected_cells(report, method)`` where the method has reported seeds, else its choice (``choice_cell``) and
  "--" in every other cell. ``labels``: {the table's label: the method's name}, every label present."""
  assert set(rows) == set(labels), f"{where}'s rows: {sorted(rows)}; expected {sorted(labels)}"
  reported = {entry["method"] for entry in report["methods"] if entry["seeds"]}
  for label, cells in rows.items():
    method = labels[label]
    if method in reported:
      assert cells == expected_cells(report, method), f"{where}: the {label} row differs from the report"
    else:
      assert cells[0] == choice_cell(report["choices"].get(method)), f"{where}: {label}'s choice is not the report's"
      assert set(cells[1:]) == {"--"}, f"{where}: {label} has numbers but no reported seeds in the report"


def check_report_is_committed_runs(report: dict, repo: pathlib.Path, keys: tuple[str, ...]) -> None:
  """Every run the report reads is committed under ``repo``, with the summary sections ``keys`` it quotes."""
  for run in report["runs"]:
    summary = json.loads((repo / run["workdir"] / "summary.json").read_text())
    assert all(summary[key] == run["summary"][key] for key in keys), run["workdir"]


def typed_runs(report: dict) -> list[dict]:
  """A comparison.json's ``runs`` as the runner hands them to the report: each summary a RunSummary."""
  return [{**run, "summary": RunSummary.from_json(run["summary"])} for run in report["runs"]]

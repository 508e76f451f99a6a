"""The tuned comparison's report (``compare/sweep.py``): comparison.{json,md} with every method's grid (valid PPL and
what the layer is worth per setting), its choice, the choices rejected for a dead seed, and the table of the runs at
each choice (``report.py``'s rows, columns and notes, with the chosen setting and the seed count)."""
from __future__ import annotations

import json
import pathlib
from typing import Callable

from stablemoe_jax.compare.comparison import Comparison
from stablemoe_jax.compare.figures import write_convergence_plot, write_fluctuation_plot, write_token_plot
from stablemoe_jax.compare.report import (budget_note, devices_note, health_note, markdown_table, method_rows,
                                          paired_sections, runs_json, table_columns)


def _grid_cell(cell: dict, rejected: dict[str, str]) -> str:
  """``rejected``: {setting name: why, e.g. "DEAD in seed 1"} of the method's rejected choices."""
  if not cell.get("in_grid", True):
    return "·"
  if cell["valid_ppl"] is None and cell["status"].startswith("the method's one setting"):
    return "its setting"
  if cell.get("diverged") is not None:
    return f"diverged at step {cell['diverged']}"
  if cell["valid_ppl"] is None:
    return "--"
  name = cell["setting"]["name"]
  worth = "" if cell.get("contribution") is None else f" {cell['contribution']:+.1%}"
  mark = "" if cell["alive"] else " DEAD"
  if cell["alive"] and cell.get("weak_layers"):
    mark = " (weak layer)"
  if name in rejected:
    mark = f" ({rejected[name]})"
  return f"{cell['valid_ppl']:.2f}{worth}{mark}"


def _why_rejected(r: dict) -> str:
  """A rejected choice's reason: "DEAD in seed 1", "diverged in seed 2 at step 400", or both joined by "; "."""
  dead = [f"DEAD in seed {', '.join(str(k) for k in r['dead_seeds'])}"] if r["dead_seeds"] else []
  return "; ".join(dead + [f"diverged in seed {k} at step {step}"
                           for k, step in r.get("diverged_seeds", {}).items()])


def _rejected(choice: dict | None) -> dict[str, str]:
  return {r["name"]: _why_rejected(r) for r in (choice or {}).get("rejected", [])}


def _choice_cell(choice: dict | None) -> str:
  if choice is None:
    return "grid not finished"
  if choice.get("every_setting_diverged"):
    return "none: every setting diverged"
  if choice.get("fixed"):
    return f"lr {choice['learning_rate']:g}, warmup {choice['warmup_steps']} (its one setting)"
  return f"lr {choice['learning_rate']:g}, warmup {choice['warmup_steps']}" + (
      " (every setting dead)" if choice["every_setting_dead"] else "")


def grid_table(result: dict, labels: dict[str, str]) -> str:
  """Every method's grid: valid PPL and what the layer is worth (valid PPL increase without it) per (lr, warmup)
  setting, DEAD where the verdict finds a layer dead (in the grid's run, or in a seed of a choice, which was then
  rejected), its choice."""
  settings = result["settings"]
  lines = ["| method | " + " | ".join(f"lr {s['learning_rate']:g}, warmup {s['warmup_steps']}" for s in settings)
           + " | choice |", "|" + "---|" * (len(settings) + 2)]
  for name, cells in result["grid"].items():
    choice = result["choices"].get(name)
    lines.append(f"| {labels.get(name, name)} | " + " | ".join(_grid_cell(c, _rejected(choice)) for c in cells)
                 + " | " + _choice_cell(choice) + " |")
  return "\n".join(lines) + "\n"


def rejected_note(result: dict, labels: dict[str, str]) -> str:
  """One line per choice rejected because a seed's layer died or a seed diverged there: its seeds' valid PPL
  ("" if none)."""
  lines = []
  for name, choice in result["choices"].items():
    for r in (choice or {}).get("rejected", []):
      seeds = [f"seed {k}: {ppl:.2f}{' (DEAD)' if int(k) in r['dead_seeds'] else ''}"
               for k, ppl in sorted(r["valid_ppl"].items(), key=lambda kv: int(kv[0]))]
      seeds += [f"seed {k}: diverged at step {step}" for k, step in r.get("diverged_seeds", {}).items()]
      lines.append(f"- {labels.get(name, name)}: lr {r['learning_rate']:g}, warmup {r['warmup_steps']} rejected "
                   f"({', '.join(seeds)}).")
  if not lines:
    return ""
  return ("Choices rejected because the layer died in one of their seeds or one diverged (seeds after the first "
          "such one are not needed):\n\n" + "\n".join(lines) + "\n")


def _divergence_sentence(result: dict) -> str:
  """Said only where a run diverged: how the sweep treated it."""
  diverged = any(c.get("diverged") is not None for cells in result["grid"].values() for c in cells) or any(
      r.get("diverged_seeds") for choice in result["choices"].values() for r in (choice or {}).get("rejected", []))
  return (" A run stopped by a non-finite loss or gradient (diverged) makes its setting ineligible in the same way."
          if diverged else "")


def missing_seeds(row: dict, expected: list[int] | None) -> list[int]:
  """The reported seeds at the row's choice that have no finished run (not trained yet), in order."""
  return [k for k in expected or [] if k not in row["seeds"]]


def _seeds_cell(row: dict, expected: list[int] | None) -> str:
  missing = missing_seeds(row, expected)
  if not missing:
    return str(len(row["seeds"]))
  return (f"{len(row['seeds'])} of {len(expected)} (seed{'s' if len(missing) > 1 else ''} "
          f"{', '.join(str(k) for k in missing)} not trained)")


def sweep_columns(rows: list[dict], expected: list[int] | None = None) -> list[tuple[str, Callable[[dict], str]]]:
  """The comparison's columns (translation's when the runs report BLEU), with the chosen setting and the seeds
  (``expected``: the seeds the rule reports; a row missing some says which)."""
  columns = table_columns(rows)
  return [columns[0], ("chosen lr / warmup", lambda r: f"{r['setting']['learning_rate']:g} / "
                                                       f"{r['setting']['warmup_steps']}"),
          ("seeds", lambda r: _seeds_cell(r, expected)), *columns[1:]]


def missing_note(rows: list[dict], expected: list[int], labels: dict[str, str]) -> str:
  """One line per method whose choice lacks reported seeds: which, and that its row is the seeds that exist ("" if
  none is missing)."""
  lines = [f"- {labels.get(r['method'], r['method'])} at lr {r['setting']['learning_rate']:g}, warmup "
           f"{r['setting']['warmup_steps']}: seed(s) {', '.join(str(k) for k in missing_seeds(r, expected))} not "
           f"trained (`{r['method']}/{r['setting']['name']}/seed<k>`); its row and paired intervals are over seed(s) "
           f"{', '.join(str(k) for k in r['seeds'])} only (an interval needs 2 paired seeds)."
           for r in rows if missing_seeds(r, expected)]
  if not lines:
    return ""
  return ("**Missing runs.** The rule reports seeds " f"{expected[0]}-{expected[-1]}" " at each choice; these are not "
          "trained yet (run the sweep again, without `report_only`, to train them):\n\n" + "\n".join(lines) + "\n")


def write_sweep_reports(comparison: Comparison, result: dict, workdir: pathlib.Path) -> list[dict]:
  """DIR/comparison.{json,md} (and convergence.png, fluctuation.png once a method has seeded runs) for a tuned
  comparison."""
  from stablemoe_jax.compare.methods import METHODS  # pylint: disable=import-outside-toplevel
  config, workdir = comparison.config, pathlib.Path(workdir)
  rows = method_rows(result["records"]) if result["records"] else []
  for row in rows:
    row["setting"] = result["records"][[r["method"] for r in result["records"]].index(row["method"])]["setting"]
  labels = {name: METHODS[name].label for name in result["grid"]}
  (workdir / "comparison.json").write_text(json.dumps(
      {"config": json.loads(config.to_json_best_effort()), "selection_steps": result["selection_steps"],
       "settings": result["settings"], "grid": result["grid"], "choices": result["choices"], "methods": rows,
       "runs": runs_json(result["records"])}, indent=2))
  train, seeds = config.train, comparison.settings.seeds
  selection = result["selection_steps"]
  text = ["# Tuned comparison\n",
          f"Each method's learning rate and warmup chosen on validation perplexity from the grid below (one run "
          f"each, seed {config.seed}, {selection} steps"
          f"{'' if selection == train.steps else ' (a shorter selection budget)'}); a setting whose MoE layer "
          f"the health verdict finds dead (DEAD: removing it costs < 1% of valid PPL, or two experts take > 90% of "
          f"the tokens) is not eligible. Then {seeds} new seed(s) at the choice (seeds {config.seed + 1}-"
          f"{config.seed + seeds}): the reported runs; the selecting seed is never reported. A choice whose layer "
          f"dies in a reported seed is rejected and the next live setting chosen.{_divergence_sentence(result)}\n",
          "## The grid (seed-0 valid PPL, and the valid PPL increase without the MoE layer)\n",
          grid_table(result, labels), rejected_note(result, labels)]
  if rows:
    expected = list(range(config.seed + 1, config.seed + seeds + 1))
    text += ["## At each method's choice\n", budget_note(comparison, rows), devices_note(rows),
             markdown_table(rows, sweep_columns(rows, expected)),
             *[note for note in [missing_note(rows, expected, labels)] if note], health_note(rows),
             paired_sections(comparison, rows, result["records"], labels),
             write_token_plot(rows, workdir / "validation_tokens.png"),
             write_convergence_plot(rows, workdir / "convergence.png"),
             write_fluctuation_plot(rows, workdir / "fluctuation.png")]
  (workdir / "comparison.md").write_text("\n".join(text))
  return rows

"""Short stage-1 probes of a router setting: train a run's first steps, then a health table per log window.

``python -m stablemoe_jax.compare.probe --config configs/default.py --workdir DIR --stop_at=200 [--config.a.b=v]``
trains the config's run (its real schedule: ``train.steps``, warmup and decay as configured) up to step
``--stop_at``, evaluates validation perplexity there (``train.eval_batches`` batches) and prints, per log
window, the worst MoE layer's mean gate, share of gates < 0.01, load balance, largest load and dropped share,
the share of the recorded validation sample whose training-time expert changed since the previous routing
record (``flips``: expert flipping), and the collapse guard's verdict. ``--stop_at=0`` only reads an existing
workdir. The table is also written to ``DIR/probe.md`` and ``DIR/probe.json``.
"""
from __future__ import annotations

import json
import pathlib

import ml_collections
import numpy as np
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from stablemoe_jax import cli
from stablemoe_jax.analysis import records as records_lib
from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.experiment import loop
from stablemoe_jax.train import health as health_lib
from stablemoe_jax.train.metrics import read_metrics

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The probe's run directory.")
_STOP_AT = flags.DEFINE_integer("stop_at", 200, "Train up to this step (0: only summarise the workdir).")
flags.mark_flags_as_required(["config", "workdir"])

_COLUMNS = (("mean_gate", min, ".3f"), ("low_gate_fraction", max, ".1%"), ("load_balance", min, ".2f"),
            ("max_load", max, ".1%"), ("dropped_fraction", max, ".1%"))


def probe_config(config: ml_collections.ConfigDict, stop_at: int) -> ml_collections.ConfigDict:
  """The config with an in-training validation at ``stop_at`` and no checkpoint before it."""
  config = ml_collections.ConfigDict(config.to_dict())
  if stop_at > 0:
    config.train.eval_every = stop_at
    config.train.checkpoint_every = max(config.train.steps, stop_at)
  return config


def flip_shares(workdir: pathlib.Path) -> dict[int, float]:
  """{record step: share of the sample's real tokens whose training-time expert differs from the previous record's,
  in the worst layer}; {} without records."""
  try:
    recs = records_lib.load_records(workdir)
  except records_lib.RecordsNotFoundError:
    return {}
  train = recs.assignments("train")  # [K, L, T]
  mask = np.broadcast_to(recs.token_mask, train.shape[1:])
  shares = {}
  for k in range(1, len(recs.steps)):
    changed = (train[k] != train[k - 1]) & mask
    shares[int(recs.steps[k])] = float(np.max(changed.sum(-1) / np.maximum(mask.sum(-1), 1)))
  return shares


def windows(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> dict:
  """Per log window the worst layer's health, the flip share since the previous record, the guard's verdict."""
  records = read_metrics(workdir)
  guard = health_lib.CollapseGuard(health_lib.GuardSettings.from_settings(settings_lib.from_config(config)))
  flips = flip_shares(workdir)
  rows, last = [], 0
  for record in records:
    layers = health_lib.layer_health(record)
    if not layers:
      continue
    newly = guard.observe(record["step"], record)
    row = {"step": record["step"], **{name: worst(v[name] for v in layers.values()) for name, worst, _ in _COLUMNS}}
    in_window = [share for step, share in flips.items() if last < step <= record["step"]]
    row["flips"] = max(in_window) if in_window else None
    row["flagged"] = [c.layer for c in newly]
    rows.append(row)
    last = record["step"]
  valid = [r for r in records if "valid/perplexity" in r]
  return {"windows": rows, "dead_layers": sorted(guard.dead),
          "flagged_at": {layer: c.step for layer, c in guard.dead.items()},
          "valid_perplexity": valid[-1]["valid/perplexity"] if valid else None,
          "valid_step": valid[-1]["step"] if valid else None}


def markdown(result: dict) -> str:
  lines = ["| step | mean gate | gates < 0.01 | load balance | max load | dropped | flips | guard |",
           "|---|---|---|---|---|---|---|---|"]
  for row in result["windows"]:
    cells = [str(row["step"])] + [format(row[name], fmt) for name, _, fmt in _COLUMNS]
    cells.append("--" if row["flips"] is None else f"{row['flips']:.1%}")
    cells.append("FLAGGED DEAD" if row["flagged"] else "")
    lines.append("| " + " | ".join(cells) + " |")
  verdict = ("dead: " + ", ".join(f"{k} at step {v}" for k, v in result["flagged_at"].items())
             if result["dead_layers"] else "guard silent")
  ppl = result["valid_perplexity"]
  lines.append(f"\nverdict: {verdict}; valid PPL at step {result['valid_step']}: "
               f"{'--' if ppl is None else format(ppl, '.2f')}\n")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  absl_logging.set_verbosity(absl_logging.WARNING)
  workdir = pathlib.Path(_WORKDIR.value)
  config = probe_config(_CONFIG.value, _STOP_AT.value)
  if _STOP_AT.value > 0:
    loop.train_and_evaluate(config, workdir, stop_at_step=_STOP_AT.value)
  result = windows(config, workdir)
  table = markdown(result)
  (workdir / "probe.json").write_text(json.dumps(result, indent=2))
  (workdir / "probe.md").write_text(table)
  print(table, flush=True)


def run() -> None:
  cli.run_app(main)


if __name__ == "__main__":
  run()

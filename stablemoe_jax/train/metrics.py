"""Metric output: TensorBoard event files (tensorboardX) and a JSONL file in the workdir."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import tensorboardX


class MetricWriter:
  """Writes ``{name: scalar or vector}`` per step; vectors (per-expert load) go whole to JSONL.

  On resumption from step ``resume_step``, records past it (written after the
  checkpoint by the interrupted run) are dropped, so the files read as one run.
  """

  def __init__(self, workdir: pathlib.Path, resume_step: int = 0):
    self._jsonl_path = pathlib.Path(workdir) / "metrics.jsonl"
    if resume_step and self._jsonl_path.exists():
      kept = [line for line in self._jsonl_path.read_text().splitlines()
              if line and json.loads(line)["step"] <= resume_step]
      self._jsonl_path.write_text("".join(line + "\n" for line in kept))
    self._tb = tensorboardX.SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"),
                                          purge_step=resume_step or None)
    self._jsonl = self._jsonl_path.open("a")

  def write(self, step: int, metrics: dict) -> None:
    record = {"step": int(step)}
    for name, value in metrics.items():
      value = np.asarray(value)
      if value.ndim == 0:
        record[name] = value.item()
        self._tb.add_scalar(name, value.item(), step)
      else:
        record[name] = value.tolist()
        for i, v in enumerate(value.ravel()):
          self._tb.add_scalar(f"{name}/{i}", float(v), step)
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()

  def close(self) -> None:
    self._jsonl.close()
    self._tb.close()


def read_metrics(workdir: pathlib.Path) -> list[dict]:
  """The records of ``workdir/metrics.jsonl`` in order ([] if there is none)."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line]


def last_logged(workdir: pathlib.Path, name: str, up_to_step: int):
  """The value of ``name`` in the last record at a step <= ``up_to_step`` that has it, else None."""
  found = None
  for record in read_metrics(workdir):
    if record["step"] <= up_to_step and name in record:
      found = record[name]
  return found

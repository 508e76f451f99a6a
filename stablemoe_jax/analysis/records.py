"""Routing records on disk: ``workdir/routing/``.

Layout:
  ``meta.json``: layer names, num_experts, train.steps, train.stage1_steps, record_every, router.
  ``sample.npy``: int32 [T], the token ids of the fixed validation sample (rows of ``seq_len``, flattened);
  [L, T] when the layers route different ids (translation: the encoder's the source, the decoder's the target).
  ``mask.npy``: bool [L, T], False at padding (absent: no padding); no fluctuation statistic counts padding.
  ``step_XXXXXXXX.npz``: one per record step, with ``train`` and ``inference``, each int8/int16
  [L, T]: the expert of every sample token in every MoE layer under the routing training used at
  that step and under the inference routing (with top-k routing, k > 1: each token's first choice), and for
  k > 1 also ``train_choices`` and ``inference_choices`` [L, T, k], every choice, first first. A top-1 run's
  files have only the first two, as every record written before top-k routing existed.

Each file is written whole (to a temporary name, then renamed), so a kill leaves no torn record.
A resumed run first drops the records past its restored step; it then rewrites them bit for bit.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re

import numpy as np

ROUTINGS = ("train", "inference")
_STEP_FILE = re.compile(r"step_(\d{8})\.npz$")


class RecordsNotFoundError(FileNotFoundError):
  """A run directory has no routing records."""


def records_dir(workdir: str | os.PathLike) -> pathlib.Path:
  return pathlib.Path(workdir) / "routing"


def index_dtype(num_experts: int) -> np.dtype:
  """The smallest signed integer type holding expert ids ``0 .. num_experts - 1``."""
  return np.dtype(np.int8) if num_experts <= np.iinfo(np.int8).max + 1 else np.dtype(np.int16)


def _atomic_write(path: pathlib.Path, write) -> None:
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "wb") as f:
    write(f)
  os.replace(tmp, path)


def record_steps(directory: pathlib.Path) -> list[int]:
  """Steps with a record file, ascending."""
  matches = (_STEP_FILE.search(p.name) for p in directory.glob("step_*.npz")) if directory.is_dir() else ()
  return sorted(int(m.group(1)) for m in matches if m)


def write_meta(directory: pathlib.Path, meta: dict, sample_tokens: np.ndarray, sample_mask: np.ndarray) -> None:
  """``sample_tokens`` int [L, T] and ``sample_mask`` bool [L, T] per MoE layer: the ids it routes and which are
  real tokens. Stored as ``sample.npy`` [T] when every layer routes the same ids, else [L, T]; ``mask.npy``
  only when some position is padding."""
  directory.mkdir(parents=True, exist_ok=True)
  _atomic_write(directory / "meta.json", lambda f: f.write(json.dumps(meta, indent=2).encode()))
  sample_tokens, sample_mask = np.asarray(sample_tokens, np.int32), np.asarray(sample_mask, bool)
  if (sample_tokens == sample_tokens[0]).all():
    sample_tokens = sample_tokens[0]
  _atomic_write(directory / "sample.npy", lambda f: np.save(f, sample_tokens))
  if not sample_mask.all():
    _atomic_write(directory / "mask.npy", lambda f: np.save(f, sample_mask))


def write_record(directory: pathlib.Path, step: int, train: np.ndarray, inference: np.ndarray,
                 num_experts: int) -> None:
  """Writes the record of ``step``: ``train`` and ``inference`` expert ids, int [L, T] each, or every choice of
  top-k routing, [L, T, k] (first first; k = 1 is written as [L, T])."""
  dtype = index_dtype(num_experts)
  train, inference = np.asarray(train).astype(dtype), np.asarray(inference).astype(dtype)
  arrays = {}
  if train.ndim == 3:
    if train.shape[-1] > 1:
      arrays = {"train_choices": train, "inference_choices": inference}
    train, inference = train[..., 0], inference[..., 0]
  arrays = {"train": train, "inference": inference, **arrays}
  _atomic_write(directory / f"step_{step:08d}.npz", lambda f: np.savez(f, **arrays))


def drop_records_after(directory: pathlib.Path, step: int) -> list[int]:
  """Deletes the records past ``step`` (written after the checkpoint a run resumes from); returns their steps."""
  dropped = [s for s in record_steps(directory) if s > step]
  for s in dropped:
    (directory / f"step_{s:08d}.npz").unlink()
  return dropped


@dataclasses.dataclass(frozen=True)
class Records:
  """A run's routing records.

  Attributes:
    steps: int [K] record steps, ascending.
    train: int [K, L, T] expert per record, layer and sample token under the training routing.
    inference: int [K, L, T] the same under the inference routing.
    sample_tokens: int32 [T] (or [L, T], per layer) token ids of the sample.
    meta: the run's ``meta.json``.
    token_mask: bool [L, T], False at padding positions of the sample.
    train_choices, inference_choices: int [K, L, T, k], every one of a token's k choices, first first (top-1
      routing, and records written before top-k existed: ``train[..., None]``, k = 1).
  """

  steps: np.ndarray
  train: np.ndarray
  inference: np.ndarray
  sample_tokens: np.ndarray
  meta: dict
  token_mask: np.ndarray | None = None  # None: no padding
  train_choices: np.ndarray | None = None  # None: top-1, the first choices
  inference_choices: np.ndarray | None = None

  def __post_init__(self):
    if self.token_mask is None:
      object.__setattr__(self, "token_mask", np.ones(self.train.shape[1:], bool))  # frozen dataclass
    for routing in ROUTINGS:
      if getattr(self, f"{routing}_choices") is None:
        object.__setattr__(self, f"{routing}_choices", self.assignments(routing)[..., None])

  @property
  def top_k(self) -> int:
    """k, the experts each token was routed to."""
    return int(self.train_choices.shape[-1])

  @property
  def layers(self) -> list[str]:
    return list(self.meta["layers"])

  def assignments(self, routing: str) -> np.ndarray:
    """int [K, L, T] for ``routing`` in ROUTINGS."""
    if routing not in ROUTINGS:
      raise ValueError(f"unknown routing {routing!r}; choose one of {ROUTINGS}")
    return self.train if routing == "train" else self.inference

  def choices(self, routing: str) -> np.ndarray:
    """int [K, L, T, k] for ``routing`` in ROUTINGS: every choice, first first."""
    self.assignments(routing)  # the name's check
    return self.train_choices if routing == "train" else self.inference_choices


def load_records(workdir: str | os.PathLike) -> Records:
  """Reads every record of the run in ``workdir``."""
  directory = records_dir(workdir)
  steps = record_steps(directory)
  if not steps or not (directory / "meta.json").is_file():
    raise RecordsNotFoundError(
        f"no routing records in {directory}; train with --config.analysis.record_every > 0 and this --workdir."
    )
  loaded = [np.load(directory / f"step_{s:08d}.npz") for s in steps]
  mask_file = directory / "mask.npy"
  choices = {f"{routing}_choices": np.stack([r[f"{routing}_choices"] for r in loaded])
             for routing in ROUTINGS if f"{routing}_choices" in loaded[0]}
  return Records(
      steps=np.asarray(steps),
      train=np.stack([r["train"] for r in loaded]),
      inference=np.stack([r["inference"] for r in loaded]),
      sample_tokens=np.load(directory / "sample.npy"),
      meta=json.loads((directory / "meta.json").read_text()),
      token_mask=np.load(mask_file) if mask_file.is_file() else None,
      **choices,
  )

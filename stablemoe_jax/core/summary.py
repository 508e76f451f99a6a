"""A finished run's ``summary.json`` as one typed value: what ``experiment/loop.py`` writes and every reader loads.

The file's keys are :class:`RunSummary`'s fields, in field order; an optional field that is None is not written (a
run without analysis records, a language model's translation entries). Versions of the file:

* version 1 (this code; the file has no ``schema_version`` key, and every committed run's summary is of it): the
  fields below. Older files of it lack ``device`` and ``num_groups`` (written before those keys: None here) or carry
  translation's and the language model's entries only for their task.
* a later version writes ``schema_version``; :meth:`RunSummary.from_json` is the one place an old file's absent or
  renamed keys get their meaning, and refuses a version it does not know.

Keys no field names are kept in ``extra`` and written back after the fields, so loading and writing a file keeps it
as it was.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

SCHEMA_VERSION = 1

# Written even when None (as null): the loop always writes them (a dense run's agreement is null).
_ALWAYS = ("distill_agreement_at_boundary",)


@dataclasses.dataclass(frozen=True)
class RunSummary:
  """``summary.json``: the run's budget, speed, final evaluations, health verdict and its task's entries.

  ``valid`` / ``test``: ``{"loss", "perplexity", "tokens"[, "batches"]}`` of the final evaluation of each split;
  ``eval``: how those evaluations scored a split (``tasks/base.py``'s ``eval_description``); ``health``: the final
  verdict (``train/health.py``, re-judged by ``compare/runner.judged``).
  """

  steps: int | None = None  # None (here and below): the key absent (a summary built in part, by a test)
  stage1_steps: int | None = None
  train_seconds_this_run: float | None = None
  train_seconds: float | None = None  # all runs of the workdir, evaluations excluded
  tokens_per_second: float | None = None
  eval: dict | None = None
  valid: dict | None = None
  test: dict | None = None
  health: dict | None = None  # None: a summary of a run without an MoE layer written before the section existed
  device: dict | None = None  # {"platform", "kind", "count", "processes"}; None: written before the key
  num_groups: int | None = None  # the routing groups it trained with; None: written before the key
  distill_agreement_at_boundary: float | None = None
  sets: dict | None = None  # language model with data.eval_sets: {name: {"valid": {...}, "test": {...}}}
  bleu: dict | None = None  # translation: decoding/bleu_report.py's report
  pair_weights: Any = None  # translation: the pairs' mixing weights
  over_length: Any = None  # translation: the pairs longer than the step's positions
  facts: dict | None = None  # data.corpus=facts: the facts probe's summary
  analysis: dict | None = None  # the routing analysis's short summary (analysis.report_at_end)
  extra: dict = dataclasses.field(default_factory=dict)  # keys of a file that no field names, kept as they were

  # The order the file's keys are written in (that of every version so far).
  ORDER = ("steps", "stage1_steps", "device", "num_groups", "train_seconds_this_run", "train_seconds",
           "tokens_per_second", "distill_agreement_at_boundary", "eval", "valid", "test", "health", "sets", "bleu",
           "pair_weights", "over_length", "facts", "analysis")

  @classmethod
  def from_json(cls, data: dict) -> RunSummary:
    """A summary of any version so far (see the module's docstring); ValueError for a later version."""
    version = data.get("schema_version", 1)
    if version != SCHEMA_VERSION:
      raise ValueError(f"summary.json of schema_version {version}; this code reads version {SCHEMA_VERSION}")
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    extra = {k: v for k, v in data.items() if k not in names and k != "schema_version"}
    return cls(**known, extra=extra)

  def to_json(self) -> dict:
    """The file's dict: the fields in :attr:`ORDER` (an optional one only when set), then ``extra``."""
    out = {}
    for name in self.ORDER:
      value = getattr(self, name)
      if value is not None or name in _ALWAYS:
        out[name] = value
    return {**out, **self.extra}

  @classmethod
  def load(cls, path: str | pathlib.Path) -> RunSummary:
    """The summary in file ``path`` (a run's ``summary.json``)."""
    return cls.from_json(json.loads(pathlib.Path(path).read_text()))

  def write(self, path: str | pathlib.Path) -> None:
    """Writes :meth:`to_json` to ``path`` as the loop always has (two-space indents)."""
    pathlib.Path(path).write_text(json.dumps(self.to_json(), indent=2))

  def with_health(self, health: dict) -> RunSummary:
    return dataclasses.replace(self, health=health)

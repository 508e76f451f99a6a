"""Routing fluctuation (the paper's Figures 2 and 8) from a run's routing records.

A token's *last fluctuation step* is the last recorded step where its expert differs from its
expert at the final record; a token whose expert never differs has none (-1 here, and it counts
as settled from the start). The curve is the cumulative share of tokens whose last fluctuation
step is at most x, with x as a percentage of training (the final record step = 100%).
With several MoE layers, every (layer, token) pair counts as one token ("all layers").

Top-k routing (k > 1) is measured twice: by each token's first (top-1) choice, as for a top-1 router, and by its
*k-set*, the set of its k experts (``k_set``): the set changed when it is not the same set, whatever the order of
the choices. For k = 1 the two are the same measure, and equal.
"""
from __future__ import annotations

import os

import numpy as np

from stablemoe_jax.analysis.records import Records, load_records

FRACTIONS = (0.2, 0.5, 0.8)


def last_fluctuation_steps(steps: np.ndarray, assignments: np.ndarray) -> np.ndarray:
  """steps int [K] ascending, assignments int [K, ...] -> int64 [...]: last step whose expert differs
  from the final one, or -1 where none does."""
  steps, assignments = np.asarray(steps), np.asarray(assignments)
  differs = assignments != assignments[-1]  # [K, ...]
  last_index = len(steps) - 1 - np.argmax(differs[::-1], axis=0)
  return np.where(differs.any(axis=0), steps[last_index], -1).astype(np.int64)


def kset_assignments(choices: np.ndarray) -> np.ndarray:
  """choices int [K, ..., k] (each token's k distinct experts) -> int64 [K, ...]: one id per set of k experts, equal
  for two entries exactly when their sets are (the order of the choices ignored); k = 1: the expert itself."""
  choices = np.asarray(choices)
  if choices.shape[-1] == 1:
    return choices[..., 0].astype(np.int64)
  rows = np.sort(choices, axis=-1).reshape(-1, choices.shape[-1])
  _, ids = np.unique(rows, axis=0, return_inverse=True)
  return ids.reshape(choices.shape[:-1]).astype(np.int64)


def cumulative_curve(last: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(x [K] record steps as % of the final one, y [K] share of tokens whose last fluctuation step <= x)."""
  steps, last = np.asarray(steps), np.asarray(last).ravel()
  share = (last[None, :] <= steps[:, None]).mean(axis=1)
  return 100.0 * steps / steps[-1], share


def shares_after(last: np.ndarray, final_step: int, fractions=FRACTIONS) -> dict[str, float]:
  """{"after_20": share of tokens whose last fluctuation step lies after 20% of final_step, ...} (fractions 0-1)."""
  last = np.asarray(last).ravel()
  return {f"after_{round(100 * f)}": float(np.mean(last > f * final_step)) for f in fractions}


def _layer_summary(steps: np.ndarray, assignments: np.ndarray, stage1_steps: int, mask: np.ndarray) -> dict:
  """steps [K], assignments [K, T] (or [K, L, T]), mask bool [T] (or [L, T]; False: padding, not counted)
  -> shares and the stage-2 stability check."""
  last = last_fluctuation_steps(steps, assignments)[mask]
  stage2 = assignments[steps >= stage1_steps][:, mask]
  return {
      **shares_after(last, int(steps[-1])),
      "never_fluctuating": float(np.mean(last < 0)),
      "last_fluctuation_step_max": int(last.max()),
      # Share of tokens changing expert at or after the stage boundary; 0 for StableMoE's training routing.
      "fluctuating_in_stage2": float(np.mean(last >= stage1_steps)),
      # None when fewer than two records lie in stage 2 (nothing to compare).
      "stage2_records_identical": bool((stage2 == stage2[0]).all()) if len(stage2) > 1 else None,
  }


def _pooled_and_per_layer(records: Records, assignments: np.ndarray, stage1_steps: int) -> dict:
  """{"all_layers": summary, "layers": {layer: summary}} of assignments [K, L, T]."""
  return {
      "all_layers": _layer_summary(records.steps, assignments, stage1_steps, records.token_mask),
      "layers": {name: _layer_summary(records.steps, assignments[:, i], stage1_steps, records.token_mask[i])
                 for i, name in enumerate(records.layers)},
  }


def routed_sets(records: Records, routing: str) -> np.ndarray:
  """int64 [K, L, T]: each token's k-set as one id (:func:`kset_assignments`)."""
  return kset_assignments(records.choices(routing))


def summarize(records: Records, routing: str = "train") -> dict:
  """Fluctuation summary of one routing ("train" or "inference"), all layers pooled and per layer: by each token's
  first choice (``all_layers``, ``layers``) and by its set of k choices (``k_set``: the same two)."""
  assignments = records.assignments(routing)  # [K, L, T]
  stage1_steps = int(records.meta["stage1_steps"])
  return {
      "routing": routing,
      "record_steps": records.steps.tolist(),
      "final_step": int(records.steps[-1]),
      "complete": int(records.steps[-1]) == int(records.meta["steps"]),
      "stage1_steps": stage1_steps,
      "sample_tokens": int(assignments.shape[-1]),
      "real_tokens": {name: int(records.token_mask[i].sum()) for i, name in enumerate(records.layers)},
      **_pooled_and_per_layer(records, assignments, stage1_steps),
      "top_k": records.top_k,
      "k_set": _pooled_and_per_layer(records, routed_sets(records, routing), stage1_steps),
  }


def _real_last_steps(records: Records, routing: str, k_set: bool = False) -> np.ndarray:
  """int64 [N]: the last fluctuation step of every real (layer, token) of the sample, padding left out; of its
  first choice, or (``k_set``) of its set of k choices."""
  assignments = routed_sets(records, routing) if k_set else records.assignments(routing)
  return last_fluctuation_steps(records.steps, assignments)[records.token_mask]


def curve_from_records(records: Records, routing: str = "train", k_set: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """The cumulative curve of one routing, all layers pooled (of each token's first choice, or of its k-set)."""
  return cumulative_curve(_real_last_steps(records, routing, k_set), records.steps)


def _shares_and_curve(last: np.ndarray, steps: np.ndarray) -> dict:
  percent, share = cumulative_curve(last, steps)
  return {**shares_after(last, int(steps[-1])),
          "curve": {"percent": [float(x) for x in percent], "share": [float(y) for y in share]}}


def shares_and_curve(records: Records, routing: str = "train") -> dict:
  """{"after_20", "after_50", "after_80": shares as shares_from_workdir's, "curve": {"percent": [K] record steps as %
  of training, "share": [K] tokens settled by then}}, of each token's first choice, with ``top_k`` and ``k_set``: the
  same of each token's set of k choices (k = 1: equal to the first): what a run's exported fluctuation.json keeps.
  A file written before top-k routing has only the first-choice keys, which are its k-set's too."""
  return {**_shares_and_curve(_real_last_steps(records, routing), records.steps), "top_k": records.top_k,
          "k_set": _shares_and_curve(_real_last_steps(records, routing, k_set=True), records.steps)}


def shares_from_workdir(workdir: str | os.PathLike, routing: str = "train", k_set: bool = False) -> dict[str, float]:
  """A run's fluctuation shares from its records: {"after_20", "after_50", "after_80"}, fractions in [0, 1].

  ``routing``: "train" (the routing training used at each record step; the paper's figures) or
  "inference"; ``k_set``: of each token's set of k choices instead of its first. Raises RecordsNotFoundError if
  the run has no records.
  """
  records = load_records(workdir)
  return shares_after(_real_last_steps(records, routing, k_set), int(records.steps[-1]))

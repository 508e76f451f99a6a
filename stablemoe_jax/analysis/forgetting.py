"""StableMoE's question asked fact by fact: is a stored fact forgotten more often when its route changes?

From the facts probe's records (``analysis/facts_probe.py``) at K evaluation points, ascending:

    steps     int  [K]      the points' steps
    recalled  bool [K, N]   fact (line) i recalled at point j (every value token the greedy choice)
    routes    int  [K, N]   one id per route of fact i's value-predicting token at point j (the training routing;
                            equal ids exactly when the sets of experts in every MoE layer are equal: ``route_ids``)

A *forgetting event* of fact i in interval (j, j + 1): recalled at j, not at j + 1. Every (fact, interval) recalled
at its start is *at risk*, counted under "route changed" when ``routes[j, i] != routes[j + 1, i]`` and under "route
kept" otherwise, so P(forget | changed) = changed forgotten / changed at risk, and likewise for kept. A route that
changes and changes back counts as changed in both of its intervals; a fact recalled only at the last point is
never at risk.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from stablemoe_jax.analysis.fluctuation import FRACTIONS, kset_assignments, last_fluctuation_steps, shares_after


@dataclasses.dataclass(frozen=True)
class ForgettingCounts:
  """(fact, interval) pairs recalled at the interval's start, and those forgotten at its end, by route change."""

  changed_at_risk: int
  changed_forgotten: int
  kept_at_risk: int
  kept_forgotten: int

  @staticmethod
  def _rate(forgotten: int, at_risk: int) -> float | None:
    return forgotten / at_risk if at_risk else None

  @property
  def p_forget_changed(self) -> float | None:
    """P(forget | route changed); None when no recalled fact's route changed."""
    return self._rate(self.changed_forgotten, self.changed_at_risk)

  @property
  def p_forget_kept(self) -> float | None:
    return self._rate(self.kept_forgotten, self.kept_at_risk)

  @property
  def p_forget(self) -> float | None:
    """P(forget) over every interval, whatever the route did."""
    return self._rate(self.changed_forgotten + self.kept_forgotten, self.changed_at_risk + self.kept_at_risk)

  def as_dict(self) -> dict:
    return {**dataclasses.asdict(self), "p_forget_changed": self.p_forget_changed,
            "p_forget_kept": self.p_forget_kept, "p_forget": self.p_forget}


def count_forgetting(recalled: np.ndarray, routes: np.ndarray) -> ForgettingCounts:
  """``recalled`` bool [K, N], ``routes`` int [K, N] (a model without routes: all equal, every interval "kept")."""
  recalled, routes = np.asarray(recalled, bool), np.asarray(routes)
  if recalled.shape != routes.shape:
    raise ValueError(f"recalled {recalled.shape} and routes {routes.shape} must have one shape [points, facts].")
  at_risk = recalled[:-1]
  forgotten = at_risk & ~recalled[1:]
  changed = routes[:-1] != routes[1:]
  return ForgettingCounts(changed_at_risk=int((at_risk & changed).sum()),
                          changed_forgotten=int((forgotten & changed).sum()),
                          kept_at_risk=int((at_risk & ~changed).sum()),
                          kept_forgotten=int((forgotten & ~changed).sum()))


def route_ids(choices: np.ndarray) -> np.ndarray:
  """int [K, L, N, k] (every MoE layer's k choices of each fact at each point) -> int64 [K, N]: equal exactly when
  the fact's set of experts is equal in every layer (order within a layer ignored). L = 0 (dense): all zeros."""
  choices = np.asarray(choices)
  points, layers, facts = choices.shape[:3]
  if layers == 0:
    return np.zeros((points, facts), np.int64)
  per_layer = np.stack([kset_assignments(choices[:, layer]) for layer in range(layers)], axis=-1)  # [K, N, L]
  _, ids = np.unique(per_layer.reshape(-1, layers), axis=0, return_inverse=True)
  return ids.reshape(points, facts).astype(np.int64)


def route_changing_after(steps: np.ndarray, routes: np.ndarray, total_steps: int) -> dict[str, float]:
  """``{"after_20": share, ...}``: the share of facts whose route at some point after 20 / 50 / 80% of
  ``total_steps`` differs from their route at the last point (the paper's fluctuation, on the facts' routes)."""
  return shares_after(last_fluctuation_steps(np.asarray(steps), np.asarray(routes)), total_steps)


def recall_at(steps: np.ndarray, recalled: np.ndarray, fractions=FRACTIONS, total_steps: int | None = None
              ) -> dict[str, float]:
  """``{"at_20": recall, ...}``: the mean recall at the first point at or after each fraction of training."""
  steps = np.asarray(steps)
  total = steps[-1] if total_steps is None else total_steps
  out = {}
  for f in fractions:
    index = int(np.searchsorted(steps, f * total))
    if index < len(steps):
      out[f"at_{round(100 * f)}"] = float(np.asarray(recalled[index]).mean())
  return out

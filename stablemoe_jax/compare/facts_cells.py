"""The facts regime's cells of a comparison (runs with ``data.corpus=facts``, whose summaries hold ``facts``): recall
and the value tokens' NLL at the end, how many experts the facts' value-predicting tokens use, and forgetting by
route change (``analysis/forgetting.py``), each a mean over the method's seeds."""
from __future__ import annotations

from typing import Callable

import numpy as np

from stablemoe_jax.core.summary import RunSummary


def _mean_or_none(values: list) -> float | None:
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else None


def value_experts(final: dict) -> list[float]:
  """Each MoE layer's experts the facts' value-predicting tokens use (exp of their load's entropy), from a facts
  summary's ``final`` metrics; [] for a model without an MoE layer."""
  return [v for k, v in final.items() if k.endswith("/value_experts")]


def facts_cells(summaries: list[RunSummary]) -> dict:
  """A method row's facts entries ({} when its runs have no facts summary)."""
  if not all(s.facts is not None for s in summaries):
    return {}
  finals = [s.facts["final"] for s in summaries]
  recall = [f["facts/recall"] for f in finals]
  experts = [value_experts(f) for f in finals]
  forgetting = [s.facts["forgetting"] for s in summaries]
  return {"facts_recall": recall, "facts_recall_mean": float(np.mean(recall)),
          "facts_recall_std": float(np.std(recall, ddof=1)) if len(recall) > 1 else 0.0,
          "facts_value_nll_mean": float(np.mean([f["facts/value_nll"] for f in finals])),
          "facts_value_experts": _mean_or_none([np.mean(e) if e else None for e in experts]),
          "facts_p_forget_changed": _mean_or_none([f["p_forget_changed"] for f in forgetting]),
          "facts_p_forget_kept": _mean_or_none([f["p_forget_kept"] for f in forgetting]),
          "facts_route_changing": [s.facts["route_changing_after"] for s in summaries]}


def share_cell(value: float | None) -> str:
  """A share as a percentage cell, "--" for None (no fact at risk)."""
  return "--" if value is None else f"{value:.1%}"


def _recall_cell(row: dict) -> str:
  spread = f" ± {row['facts_recall_std']:.1%}" if len(row["facts_recall"]) > 1 else ""
  return f"{row['facts_recall_mean']:.1%}{spread}"


def facts_columns(columns: list[tuple[str, Callable[[dict], str]]]) -> list[tuple[str, Callable[[dict], str]]]:
  """The LM's columns with the facts' in place of test perplexity."""
  facts = [("recall", _recall_cell),
           ("value NLL", lambda r: f"{r['facts_value_nll_mean']:.3f}"),
           ("experts the facts use", lambda r: "--" if r["facts_value_experts"] is None
            else f"{r['facts_value_experts']:.1f}"),
           ("forgetting: route changed / kept", lambda r: f"{share_cell(r['facts_p_forget_changed'])} / "
                                                           f"{share_cell(r['facts_p_forget_kept'])}")]
  return [column for header, cell in columns for column in (facts if header == "test PPL" else [(header, cell)])]

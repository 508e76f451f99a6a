"""Cohesion (the paper's Table 7): the most frequent tokens each expert receives, and load statistics."""
from __future__ import annotations

from typing import Callable

import numpy as np

from stablemoe_jax.models.routing import LOW_GATE


class RoutingCounts:
  """Accumulates, for one MoE layer, how often each token id goes to each expert, and the gates.

  Top-k routing: each of a token's k choices counts once for its expert (the load counts choices, as the training
  log's does), and the gate metrics read the largest of a token's k gates (``models.routing.routing_health``'s rule).

  Args:
    num_experts: N.
    vocab_size: V.
  """

  def __init__(self, num_experts: int, vocab_size: int):
    self.num_experts, self.vocab_size = num_experts, vocab_size
    self.counts = np.zeros((num_experts, vocab_size), np.int64)  # [N, V]
    self.gate_sum = np.zeros(num_experts, np.float64)  # [N], every choice's gate on its expert
    self.top_gate_sum = 0.0  # the sum over tokens of each token's largest gate
    self.low_gate_count = 0  # tokens whose largest gate < LOW_GATE
    self.tokens = 0  # real tokens counted

  def add(self, token_ids: np.ndarray, expert_index: np.ndarray, gate: np.ndarray | None = None,
          mask: np.ndarray | None = None) -> None:
    """token_ids int [T], expert_index int [T] or [T, k], gate float as expert_index, mask bool [T] (False:
    padding, not counted); any shapes holding those T (and k) in that order."""
    token_ids = np.ravel(token_ids)
    expert_index = np.reshape(expert_index, (token_ids.size, -1))  # [T, k]
    mask = np.ones(token_ids.shape, bool) if mask is None else np.ravel(mask).astype(bool)
    choices = expert_index[mask].astype(np.int64)  # [T', k]
    flat = (choices * self.vocab_size + token_ids[mask][:, None]).ravel()
    self.counts += np.bincount(flat, minlength=self.num_experts * self.vocab_size).reshape(self.counts.shape)
    self.tokens += int(mask.sum())
    if gate is not None:
      gate = np.reshape(gate, expert_index.shape)[mask]  # [T', k]
      self.gate_sum += np.bincount(choices.ravel(), weights=gate.ravel(), minlength=self.num_experts)
      top_gate = gate.max(axis=1)  # [T']
      self.top_gate_sum += float(top_gate.sum())
      self.low_gate_count += int(np.sum(top_gate < LOW_GATE))

  def top_tokens(self, k: int, id_to_token: Callable[[int], str]) -> list[dict]:
    """Per expert: its token count, its share of all tokens and its k most frequent tokens
    (ties: lower id first), each with count and share of the expert's tokens."""
    per_expert = self.counts.sum(axis=1)
    total = max(int(per_expert.sum()), 1)
    table = []
    for expert, row in enumerate(self.counts):
      order = np.argsort(-row, kind="stable")[:k]
      n = max(int(per_expert[expert]), 1)
      table.append({
          "expert": expert,
          "tokens": int(per_expert[expert]),
          "load": int(per_expert[expert]) / total,
          "top": [{"token": id_to_token(int(i)), "id": int(i), "count": int(row[i]), "share": int(row[i]) / n}
                  for i in order if row[i] > 0],
      })
    return table

  def load_stats(self) -> dict:
    """Per-expert load, its entropy in nats (log N when balanced), the mean gate overall and per expert, and
    the router-health metrics of the training log (``models.routing.routing_health``) over the counted tokens.

    Top-k: the load is each expert's share of the choices and ``mean_gate_per_expert`` the mean gate of its
    choices; ``tokens``, ``mean_gate`` and ``low_gate_fraction`` count tokens, by their largest gate."""
    per_expert = self.counts.sum(axis=1)
    total = max(int(per_expert.sum()), 1)
    tokens = max(self.tokens, 1)
    load = per_expert / total
    used = load[load > 0]
    entropy = float(-np.sum(used * np.log(used)))  # nats; 0 when no token was counted
    return {
        "tokens": self.tokens,
        "load": load.tolist(),
        "load_entropy": entropy,
        "max_entropy": float(np.log(self.num_experts)),
        "load_balance": load_balance(per_expert),
        "max_load": float(load.max()),
        "low_gate_fraction": self.low_gate_count / tokens,
        "mean_gate": self.top_gate_sum / tokens,
        "mean_gate_per_expert": (self.gate_sum / np.maximum(per_expert, 1)).tolist(),
    }


def load_balance(load: np.ndarray) -> float:
  """The entropy of a per-expert load [N] (counts or shares) over ln N: 1 when every expert is equally used, 0 for
  one expert or no load at all; 1.0 for N = 1."""
  load = np.asarray(load, np.float64)
  load = load / max(load.sum(), 1e-12)
  used = load[load > 0]
  return float(-np.sum(used * np.log(used)) / np.log(len(load))) if len(load) > 1 else 1.0


def markdown_table(layer_tables: dict[str, list[dict]]) -> str:
  """{layer: top_tokens(...)} -> Markdown, one table per layer."""
  lines = []
  for layer, table in layer_tables.items():
    lines += [f"### {layer}", "", "| expert | load | most frequent tokens (count, share of the expert's tokens) |",
              "|---|---|---|"]
    for row in table:
      tokens = ", ".join(f"`{t['token']}` ({t['count']}, {100 * t['share']:.1f}%)" for t in row["top"])
      lines.append(f"| {row['expert']} | {100 * row['load']:.1f}% | {tokens.replace('|', '&#124;')} |")
    lines.append("")
  return "\n".join(lines)

"""comparison.json, comparison.md (the paper's Table 3) and convergence.png (Figure 5) from the runs' records."""
from __future__ import annotations

import json
import pathlib
from typing import Callable

import numpy as np


def _mean_std(values: list[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for one value)."""
  array = np.asarray(values, dtype=np.float64)
  return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def _mean_curve(curves: list[list[list[float]]]) -> list[list[float]]:
  """Point-wise mean over seeds of [[seconds, perplexity], ...] curves (cut to the shortest)."""
  length = min(len(c) for c in curves)
  return np.mean(np.asarray([c[:length] for c in curves], dtype=np.float64), axis=0).tolist()


def _mean_shares(shares: list[dict | None]) -> dict[str, float] | None:
  """Mean over seeds of each fluctuation share; None if any run has no routing records."""
  if not shares or any(s is None for s in shares):
    return None
  return {key: float(np.mean([s[key] for s in shares])) for key in shares[0]}


def method_rows(records: list[dict]) -> list[dict]:
  """One dict per method (in run order) with every number of the table; extend a row with more keys freely."""
  rows: dict[str, dict] = {}
  for record in records:
    rows.setdefault(record["method"], {"records": []})["records"].append(record)
  result = []
  for name, row in rows.items():
    runs = row["records"]
    first = runs[0]
    summaries = [r["summary"] for r in runs]
    valid = _mean_std([s["valid"]["perplexity"] for s in summaries])
    test = _mean_std([s["test"]["perplexity"] for s in summaries])
    agreements = [s.get("distill_agreement_at_boundary") for s in summaries]
    result.append({
        "method": name, "label": first["label"], "overrides": first["overrides"], "seeds": [r["seed"] for r in runs],
        "shared_params": first["shared_params"], "expert_params": first["expert_params"],
        "total_params": first["total_params"], "flops_per_token": first["flops_per_token"],
        "valid_ppl_mean": valid[0], "valid_ppl_std": valid[1], "test_ppl_mean": test[0], "test_ppl_std": test[1],
        "valid_ppl": [s["valid"]["perplexity"] for s in summaries],
        "test_ppl": [s["test"]["perplexity"] for s in summaries],
        "tokens_per_second": float(np.mean([s["tokens_per_second"] for s in summaries])),
        "train_seconds": float(np.mean([s["train_seconds"] for s in summaries])),
        "distill_agreement_at_boundary": (float(np.mean(agreements)) if all(a is not None for a in agreements)
                                          else None),
        "fluctuation": _mean_shares([r.get("fluctuation") for r in runs]),
        "eval": summaries[0].get("eval"),
        "curve": _mean_curve([r["curve"] for r in runs]),
    })
  return result


def _millions(n: float) -> str:
  return f"{n / 1e6:.2f}M"


def _ppl(row: dict, split: str) -> str:
  mean, std = row[f"{split}_ppl_mean"], row[f"{split}_ppl_std"]
  return f"{mean:.2f} ± {std:.2f}" if len(row["seeds"]) > 1 else f"{mean:.2f}"


# (header, cell) per column of comparison.md; append a column here to extend the table.
COLUMNS: list[tuple[str, Callable[[dict], str]]] = [
    ("method", lambda r: r["label"]),
    ("shared params", lambda r: _millions(r["shared_params"])),
    ("expert params", lambda r: _millions(r["expert_params"])),
    ("FLOPs / token (fwd)", lambda r: _millions(r["flops_per_token"])),
    ("valid PPL", lambda r: _ppl(r, "valid")),
    ("test PPL", lambda r: _ppl(r, "test")),
    ("train tokens/s", lambda r: f"{r['tokens_per_second']:,.0f}"),
    ("train wall time", lambda r: f"{r['train_seconds'] / 60:.1f} min"),
    ("distill agreement at stage-1 end", lambda r: "--" if r["distill_agreement_at_boundary"] is None
     else f"{r['distill_agreement_at_boundary']:.1%}"),
    ("tokens changing expert after 50% / 80% of training", lambda r: "--" if r["fluctuation"] is None
     else f"{r['fluctuation']['after_50']:.1%} / {r['fluctuation']['after_80']:.1%}"),
]


def markdown_table(rows: list[dict], columns=COLUMNS) -> str:
  lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cell(row) for _, cell in columns) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def _budget_note(config, rows: list[dict]) -> str:
  train = config.train
  seeds = config.compare.seeds
  eval_mode = rows[0]["eval"] or {}
  mode = (f"sliding windows of {eval_mode.get('seq_len')} tokens, stride {eval_mode.get('stride')}"
          if eval_mode.get("mode") == "sliding" else f"non-overlapping blocks of {eval_mode.get('seq_len')} tokens")
  return (f"Every method: {train.steps} steps of {train.batch_size} x {train.seq_len} tokens "
          f"({train.steps * train.batch_size * train.seq_len:,} tokens), {train.stage1_steps} in stage 1 where a "
          f"method has one; {seeds} seed(s), perplexity mean{' ± sample std' if seeds > 1 else ''} over seeds, on "
          f"every token of the split ({mode}). FLOPs: forward matmuls per token, top-1 (the active expert only). "
          f"Wall time and tokens/s: training (compilation included), evaluations excluded. Distill agreement: "
          f"validation tokens whose distilled-router expert is the learned one, at the end of stage 1. "
          f"Tokens changing expert: of the recorded validation sample, the share whose expert in the routing used "
          f"for training last changed after 50% (80%) of the steps (routing fluctuation, the paper's Figures 2 and 8).\n")


def write_plot(rows: list[dict], path: pathlib.Path) -> None:
  """Validation perplexity against training wall time, one curve per method (the paper's Figure 5)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  figure, axes = plt.subplots(figsize=(7, 4.5))
  for row in rows:
    curve = np.asarray(row["curve"])
    axes.plot(curve[:, 0] / 60, curve[:, 1], marker="o", markersize=3, label=row["label"])
  axes.set_xlabel("training wall time (min)")
  axes.set_ylabel("validation perplexity")
  axes.set_yscale("log")
  axes.grid(True, which="both", alpha=0.3)
  axes.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def write_reports(config, records: list[dict], workdir: pathlib.Path) -> list[dict]:
  """Writes DIR/comparison.json, DIR/comparison.md and DIR/convergence.png; returns the method rows."""
  workdir = pathlib.Path(workdir)
  rows = method_rows(records)
  (workdir / "comparison.json").write_text(json.dumps(
      {"config": json.loads(config.to_json_best_effort()), "methods": rows, "runs": records}, indent=2))
  (workdir / "comparison.md").write_text(
      "# Comparison\n\n" + _budget_note(config, rows) + "\n" + markdown_table(rows)
      + "\n![validation perplexity against training wall time](convergence.png)\n")
  write_plot(rows, workdir / "convergence.png")
  return rows

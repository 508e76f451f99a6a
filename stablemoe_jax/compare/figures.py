"""The comparison's figures: validation perplexity against training wall time (convergence.png) and against
training tokens (validation_tokens.png), the paper's Figure 5; routing fluctuation (fluctuation.png), its Figure 2."""
from __future__ import annotations

import collections
import pathlib

import numpy as np

from stablemoe_jax.analysis import plot


def device_counts(rows: list[dict]) -> collections.Counter:
  """How many runs trained on each kind of device ("1 x cpu", ...)."""
  return collections.Counter(label for row in rows for label in row.get("devices", []))


def curve_scope(rows: list[dict]) -> str:
  """What the curves' points score: "" for the whole validation split, else "first N batches" (``train.eval_batches``
  of the runs, "N / M" if methods differ)."""
  scopes = sorted({row.get("curve_batches", 0) for row in rows})
  return "" if scopes == [0] else f"first {' / '.join(str(n) if n else 'all' for n in scopes)} batches"


def validation_label(rows: list[dict]) -> str:
  """The validation axis's label."""
  scope = curve_scope(rows)
  return f"validation perplexity{', ' + scope if scope else ''} (mean over seeds)"


def _plot_validation(rows: list[dict], key: str, x_scale: float, x_label: str, path: pathlib.Path) -> None:
  """One log-scale curve per method of ``row[key]`` ([[x, valid perplexity], ...], x divided by ``x_scale``)."""
  plt = plot.pyplot()
  figure, axes = plt.subplots(figsize=(7, 4.5))
  for row in rows:
    curve = np.asarray(row[key])
    axes.plot(curve[:, 0] / x_scale, curve[:, 1], marker="o", markersize=3, label=row["label"])
  axes.set_xlabel(x_label)
  axes.set_ylabel(validation_label(rows))
  axes.set_yscale("log")
  for axis_format in (axes.yaxis.set_major_formatter, axes.yaxis.set_minor_formatter):
    axis_format("{x:.0f}")  # plain perplexities, not powers of ten
  axes.grid(True, which="both", alpha=0.3)
  axes.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def write_plot(rows: list[dict], path: pathlib.Path) -> None:
  """Validation perplexity against training wall time, one curve per method (the paper's Figure 5)."""
  _plot_validation(rows, "curve", 60, "training wall time (min)", path)


def write_token_plot(rows: list[dict], path: pathlib.Path) -> str:
  """Validation perplexity against training tokens, one curve per method (the paper's Figure 5 with tokens on the
  x-axis: it compares runs made on different devices); returns the markdown line that shows it."""
  rows = [row for row in rows if row.get("token_curve")]
  if not rows:
    return ""
  _plot_validation(rows, "token_curve", 1e6, "scored training tokens (millions; translation: target tokens)", path)
  scope = curve_scope(rows)
  scope = (f"\nEach point scores the in-training validation ({scope} of the split), the same for every method; "
           "where the final validation (the table's) scores other batches, it is not a point of the curves.\n"
           if scope else "")
  return f"\n![validation perplexity against training tokens]({path.name})\n{scope}"


def _curve_label(row: dict) -> str:
  """The method's label, with "(k of n seeds)" when only some of its runs kept a fluctuation curve."""
  runs, seeds = row["fluctuation_curve"]["runs"], len(row["seeds"])
  return row["label"] if runs == seeds else f"{row['label']} ({runs} of {seeds} seeds)"


def write_convergence_plot(rows: list[dict], path: pathlib.Path) -> str:
  """Draws ``write_plot`` and returns the markdown line that shows it; when the runs trained on more than one kind
  of device their wall times do not compare, so it draws nothing, removes a stale plot and says why."""
  if len(device_counts(rows)) > 1:
    path.unlink(missing_ok=True)
    return ("\nNo convergence plot: the runs trained on more than one kind of device, so their wall times do not "
            "compare.\n")
  write_plot(rows, path)
  return f"\n![validation perplexity against training wall time]({path.name})\n"


def write_fluctuation_plot(rows: list[dict], path: pathlib.Path) -> str:
  """The methods' mean fluctuation curves on one chart (the paper's Figure 2), training routing; returns the
  markdown line that shows it, or "" when no method has curves (no routing records, or exported without them)."""
  curves = [(_curve_label(row), np.asarray(row["fluctuation_curve"]["percent"]),
             np.asarray(row["fluctuation_curve"]["share"])) for row in rows if row.get("fluctuation_curve")]
  if not curves:
    return ""
  plot.plot_curves(curves, path, title="routing fluctuation (training routing, mean over seeds)")
  return f"\n![tokens whose expert last changed by each point of training]({path.name})\n"

"""comparison.json, comparison.md (the paper's Table 3), convergence.png (Figure 5) and fluctuation.png (Figure 2)
from the runs' records: the method rows, the table's columns and its notes. The tuned comparison's report (its grid,
choices and the rows at each choice) is ``sweep_report.py``, built from these."""
from __future__ import annotations

import json
import pathlib
from typing import Callable

import numpy as np

from stablemoe_jax.compare import paired
from stablemoe_jax.compare.comparison import Comparison
from stablemoe_jax.compare.facts_cells import facts_cells, facts_columns
from stablemoe_jax.compare.figures import device_counts, write_convergence_plot, write_fluctuation_plot
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.train import health as health_lib


def _mean_std(values: list[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for one value)."""
  array = np.asarray(values, dtype=np.float64)
  return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def _mean_curve(curves: list[list[list[float]]]) -> list[list[float]]:
  """Point-wise mean over seeds of [[seconds, perplexity], ...] curves (cut to the shortest)."""
  length = min(len(c) for c in curves)
  return np.mean(np.asarray([c[:length] for c in curves], dtype=np.float64), axis=0).tolist()


def _mean_shares(shares: list[dict | None]) -> dict[str, float] | None:
  """Mean over seeds of each fluctuation share ("after_20", ...); None if any run has no routing records."""
  if not shares or any(s is None for s in shares):
    return None
  return {key: float(np.mean([s[key] for s in shares])) for key in shares[0] if key.startswith("after_")}


def _k_set_shares(shares: list[dict | None]) -> dict[str, float] | None:
  """Mean over seeds of each k-set fluctuation share (a token changing its set of k experts); a file written before
  top-k routing has only first-choice shares, which are its k-set's (k = 1). None as :func:`_mean_shares`."""
  return _mean_shares([s and s.get("k_set", s) for s in shares])


def _top_k(shares: list[dict | None]) -> int:
  """The most choices a token takes in any of the runs (1 for a file written before top-k routing, or no records)."""
  return max([int(s.get("top_k", 1)) for s in shares if s] or [1])


def _mean_fluctuation_curve(shares: list[dict | None]) -> dict | None:
  """The mean of the runs' fluctuation curves at each record: "percent" [K], "share" [K], and "runs", how many runs
  kept a curve. Runs exported before curves were kept have shares only and are left out of the mean (the plot's
  label says how many runs it averages); None if no run has a curve or their record steps differ."""
  curves = [s["curve"] for s in shares if s and s.get("curve")]
  if not curves or any(c["percent"] != curves[0]["percent"] for c in curves):
    return None
  return {"percent": curves[0]["percent"], "share": np.mean([c["share"] for c in curves], axis=0).tolist(),
          "runs": len(curves)}


def _shares_cell(shares: dict | None) -> str:
  return "--" if shares is None else " / ".join(f"{shares[key]:.1%}" for key in ("after_20", "after_50", "after_80"))


# A token's set of k experts changing (it equals the first choice's column at k = 1, so a top-1 table leaves it out).
K_SET_COLUMN = ("k-sets changing after 20% / 50% / 80%", lambda r: _shares_cell(r.get("fluctuation_k_set")))


# Per run: each health metric of its worst MoE layer (the one closest to dead), then the mean over seeds.
_WORST = {"mean_gate": min, "low_gate_fraction": max, "load_balance": min, "max_load": max, "dropped_fraction": max}


def _run_health(summary: RunSummary) -> dict | None:
  """One run's health cells: worst-layer metrics of its last logged window, the smallest layer contribution,
  its dead layers; ``{"moe_layers": 0}`` for a dense model, None if the summary predates health reporting."""
  health = summary.health
  if health is None:
    return None
  layers = health.get("layers", {})
  contributions = health.get("contribution", {}).get("layers", {})
  result = {"moe_layers": len(layers), "dead_layers": list(health.get("dead_layers", [])),
            "weak_layers": list(health.get("weak_layers", []))}
  if layers:
    result.update({name: worst(v[name] for v in layers.values()) for name, worst in _WORST.items()})
  if contributions:
    result["contribution"] = health_lib.least_contribution(health)
    result["layer_contributions"] = {layer: c["relative_perplexity_increase"] for layer, c in contributions.items()}
  return result


def _method_health(runs: list[dict]) -> dict | None:
  """Mean over seeds of the runs' health cells, and ``dead`` = [(seed, layer), ...]; None if any run lacks them."""
  per_run = [_run_health(r["summary"]) for r in runs]
  if any(h is None for h in per_run):
    return None
  result = {"moe_layers": per_run[0]["moe_layers"],
            "dead": [[r["seed"], layer] for r, h in zip(runs, per_run) for layer in h["dead_layers"]]}
  weak = [[r["seed"], layer] for r, h in zip(runs, per_run) for layer in h["weak_layers"]]
  if weak:  # a layer under the line while another of the model's works (> 1 MoE layer): reported, not dead
    result["weak"] = weak
  for name in (*_WORST, "contribution"):
    values = [h[name] for h in per_run if name in h]
    result[name] = float(np.mean(values)) if values and len(values) == len(per_run) else None
  layers = [h.get("layer_contributions") for h in per_run]
  if all(layers) and layers:  # each layer's worth, mean over seeds (translation: the encoder's and the decoder's)
    result["layer_contributions"] = {layer: float(np.mean([run[layer] for run in layers])) for layer in layers[0]}
  return result


def _bleu_cells(summaries: list[RunSummary]) -> dict:
  """Translation runs: mean over seeds of each pair's test BLEU and of their average (Table 4); {} for the LM."""
  if summaries[0].bleu is None:
    return {}
  pairs = list(summaries[0].bleu["per_pair"])
  average = _mean_std([s.bleu["average"] for s in summaries])
  return {"bleu_per_pair": {p: float(np.mean([s.bleu["per_pair"][p] for s in summaries])) for p in pairs},
          "bleu_average_mean": average[0], "bleu_average_std": average[1],
          "bleu_average": [s.bleu["average"] for s in summaries],
          "bleu_signature": summaries[0].bleu["signature"]}


def _set_cells(summaries: list[RunSummary]) -> dict[str, dict] | None:
  """Runs with named held-out sets (``data.eval_sets``): per set, the valid and test perplexity of each seed and
  their means, ``{name: {"valid": [...], "valid_mean", "test": [...], "test_mean"}}``; None without sets."""
  if not all(s.sets for s in summaries):
    return None
  return {name: {**{split: [s.sets[name][split]["perplexity"] for s in summaries] for split in ("valid", "test")},
                 **{f"{split}_mean": float(np.mean([s.sets[name][split]["perplexity"] for s in summaries]))
                    for split in ("valid", "test")}}
          for name in summaries[0].sets}


def _valid_loss(summary: RunSummary) -> float:
  """Validation loss per token; runs whose summary predates the "loss" key give log(perplexity), the same value."""
  valid = summary.valid
  return float(valid["loss"]) if "loss" in valid else float(np.log(valid["perplexity"]))


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
    valid = _mean_std([s.valid["perplexity"] for s in summaries])
    valid_losses = [_valid_loss(s) for s in summaries]
    valid_loss = _mean_std(valid_losses)
    test = _mean_std([s.test["perplexity"] for s in summaries])
    train_losses = [r.get("train_loss") for r in runs]
    train_loss = _mean_std(train_losses) if None not in train_losses else (None, None)
    agreements = [s.distill_agreement_at_boundary for s in summaries]
    fluctuations = [r.get("fluctuation") for r in runs]
    result.append({
        "method": name, "label": first["label"], "overrides": first["overrides"], "seeds": [r["seed"] for r in runs],
        "shared_params": first["shared_params"], "expert_params": first["expert_params"],
        "total_params": first["total_params"], "flops_per_token": first["flops_per_token"],
        "valid_ppl_mean": valid[0], "valid_ppl_std": valid[1], "test_ppl_mean": test[0], "test_ppl_std": test[1],
        "valid_ppl": [s.valid["perplexity"] for s in summaries],
        "valid_loss_mean": valid_loss[0], "valid_loss_std": valid_loss[1],
        "valid_loss": valid_losses,
        "train_loss_mean": train_loss[0], "train_loss_std": train_loss[1], "train_loss": train_losses,
        "sets": _set_cells(summaries),
        **_bleu_cells(summaries),
        **facts_cells(summaries),
        "test_ppl": [s.test["perplexity"] for s in summaries],
        "tokens_per_second": float(np.mean([s.tokens_per_second for s in summaries])),
        "train_seconds": float(np.mean([s.train_seconds for s in summaries])),
        "distill_agreement_at_boundary": (float(np.mean(agreements)) if all(a is not None for a in agreements)
                                          else None),
        "fluctuation": _mean_shares(fluctuations),
        "fluctuation_curve": _mean_fluctuation_curve(fluctuations),
        "fluctuation_k_set": _k_set_shares(fluctuations),
        "top_k": _top_k(fluctuations),
        "health": _method_health(runs),
        "eval": summaries[0].eval,
        "devices": [_device_label(s) for s in summaries],
        "curve_batches": first.get("curve_batches", 0),
        "curve": _mean_curve([r["curve"] for r in runs]),
        "token_curve": (_mean_curve([r["token_curve"] for r in runs])
                        if all(r.get("token_curve") for r in runs) else None),
    })
  return result


def _device_label(summary: RunSummary) -> str:
  device = summary.device
  return f"{device['count']} x {device['kind']}" if device else "unrecorded"


def devices_note(rows: list[dict]) -> str:
  """Where the runs trained: tokens/s and wall time compare like with like only on one kind of device."""
  counts = device_counts(rows)
  where = ", ".join(f"{label} ({n} run{'s' if n > 1 else ''})" for label, n in sorted(counts.items()))
  mixed = " The speed columns mix devices: compare them only within one." if len(counts) > 1 else ""
  return f"Trained on: {where}.{mixed}\n"


def _millions(n: float) -> str:
  return f"{n / 1e6:.2f}M"


def _mean_cell(row: dict, name: str) -> str:
  """``row[name + "_mean"]``, with ``± row[name + "_std"]`` when there are several seeds."""
  mean, std = row[f"{name}_mean"], row[f"{name}_std"]
  return f"{mean:.2f} ± {std:.2f}" if len(row["seeds"]) > 1 else f"{mean:.2f}"


def _train_loss_cell(row: dict) -> str:
  """The mean logged training task loss over the last 20% of the steps (``runner.training_loss``), ± over seeds."""
  mean, std = row.get("train_loss_mean"), row.get("train_loss_std")
  if mean is None:
    return "--"
  return f"{mean:.3f} ± {std:.3f}" if len(row["seeds"]) > 1 else f"{mean:.3f}"


def _is_dead(row: dict) -> bool:
  return bool(row.get("health") and row["health"]["dead"])


def _health_cell(name: str, fmt: str) -> Callable[[dict], str]:
  def cell(row: dict) -> str:
    value = (row.get("health") or {}).get(name)
    return "--" if value is None else format(value, fmt)
  return cell


def _health_verdict(row: dict) -> str:
  health = row.get("health")
  if health is None:
    return "not recorded"
  if not health["moe_layers"]:
    return "no MoE layer"
  if health["dead"]:
    return "DEAD LAYER: " + ", ".join(f"{layer} (seed {seed})" for seed, layer in health["dead"])
  if health.get("weak"):
    return "ok; weak layer: " + ", ".join(f"{layer} (seed {seed})" for seed, layer in health["weak"])
  return "ok"


# (header, cell) per column of comparison.md; append a column here to extend the table.
COLUMNS: list[tuple[str, Callable[[dict], str]]] = [
    ("method", lambda r: f"{r['label']} (DEAD LAYER)" if _is_dead(r) else r["label"]),
    ("shared params", lambda r: _millions(r["shared_params"])),
    ("expert params", lambda r: _millions(r["expert_params"])),
    ("FLOPs / token (fwd)", lambda r: _millions(r["flops_per_token"])),
    ("valid PPL", lambda r: _mean_cell(r, "valid_ppl")),
    ("test PPL", lambda r: _mean_cell(r, "test_ppl")),
    ("train loss (last 20% of steps)", lambda r: _train_loss_cell(r)),
    ("train tokens/s", lambda r: f"{r['tokens_per_second']:,.0f}"),
    ("train wall time", lambda r: f"{r['train_seconds'] / 60:.1f} min"),
    ("distill agreement at stage-1 end", lambda r: "--" if r["distill_agreement_at_boundary"] is None
     else f"{r['distill_agreement_at_boundary']:.1%}"),
    ("tokens changing expert after 20% / 50% / 80% of training", lambda r: _shares_cell(r["fluctuation"])),
    K_SET_COLUMN,
    ("router health", _health_verdict),
    ("mean gate", _health_cell("mean_gate", ".3f")),
    ("gates < 0.01", _health_cell("low_gate_fraction", ".1%")),
    ("load balance", _health_cell("load_balance", ".2f")),
    ("max load", _health_cell("max_load", ".1%")),
    ("dropped", _health_cell("dropped_fraction", ".1%")),
    ("valid PPL increase without the layer", _health_cell("contribution", "+.2%")),
]


def _layer_worth_cell(row: dict) -> str:
  """``encoder_moe_0 +4.0% / decoder_moe_0 +19.1%``: each layer's worth, mean over the seeds."""
  layers = (row.get("health") or {}).get("layer_contributions")
  if not layers:
    return "--"
  return " / ".join(f"{layer} {value:+.2%}" for layer, value in sorted(layers.items()))


def translation_columns(pairs: list[str]) -> list[tuple[str, Callable[[dict], str]]]:
  """COLUMNS for translation (the paper's Table 4): validation loss and test BLEU per pair and their average in
  place of perplexity; no FLOPs column (``flops.forward_flops_per_token`` counts a decoder LM's)."""
  bleu = [(f"{pair.split('-')[0]}→{pair.split('-')[1]} BLEU", lambda r, pair=pair: f"{r['bleu_per_pair'][pair]:.2f}")
          for pair in pairs]
  replaced = {"valid PPL": [("valid loss", lambda r: _mean_cell(r, "valid_loss"))],
              "test PPL": [*bleu, ("average BLEU", lambda r: _mean_cell(r, "bleu_average"))],
              "FLOPs / token (fwd)": [],
              "valid PPL increase without the layer": [("valid PPL increase without each layer", _layer_worth_cell)]}
  return [column for header, cell in COLUMNS for column in replaced.get(header, [(header, cell)])]


def table_columns(rows: list[dict]) -> list[tuple[str, Callable[[dict], str]]]:
  """The LM's COLUMNS, translation's when the runs report BLEU, the facts regime's when they report recall."""
  if "bleu_per_pair" in rows[0]:
    return translation_columns(list(rows[0]["bleu_per_pair"]))
  return facts_columns(COLUMNS) if all("facts_recall" in row for row in rows) else COLUMNS


def markdown_table(rows: list[dict], columns=None) -> str:
  """The rows as a markdown table; the k-set column only when a row routes each token to more than one expert."""
  columns = table_columns(rows) if columns is None else columns
  if not any(row.get("top_k", 1) > 1 for row in rows):
    columns = [column for column in columns if column[0] != K_SET_COLUMN[0]]
  lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cell(row) for _, cell in columns) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def budget_note(comparison: Comparison, rows: list[dict]) -> str:
  train, seeds = comparison.config.train, comparison.settings.seeds
  eval_mode = rows[0]["eval"] or {}
  if eval_mode.get("mode") == "teacher_forced_sentences":
    return (f"Every method: {train.steps} steps of {train.batch_size} sentence pairs of up to {train.seq_len} tokens "
            f"a side, {train.stage1_steps} in stage 1 where a method has one; {seeds} seed(s), mean"
            f"{' ± sample std' if seeds > 1 else ''} over seeds. Valid loss: unsmoothed NLL per target token, "
            f"teacher-forced. BLEU: cased sacreBLEU ({rows[0].get('bleu_signature', '')}) of the test split per "
            f"pair (Multi30k test_2016_flickr, the Bible's test books) and their average (the paper's Table 4). "
            f"Tokens changing expert: of the recorded validation pairs' real tokens (both MoE layers), the share "
            f"whose expert in the routing used for training last changed after 20% (50%, 80%) of the steps.\n")
  mode = (f"sliding windows of {eval_mode.get('seq_len')} tokens, stride {eval_mode.get('stride')}"
          if eval_mode.get("mode") == "sliding" else f"non-overlapping blocks of {eval_mode.get('seq_len')} tokens")
  return (f"Every method: {train.steps} steps of {train.batch_size} x {train.seq_len} tokens "
          f"({train.steps * train.batch_size * train.seq_len:,} tokens), {train.stage1_steps} in stage 1 where a "
          f"method has one; {seeds} seed(s), perplexity mean{' ± sample std' if seeds > 1 else ''} over seeds, on "
          f"every token of the split ({mode}). FLOPs: forward matmuls per token, top-1 (the active expert only). "
          f"Wall time and tokens/s: training (compilation included), evaluations excluded. Distill agreement: "
          f"validation tokens whose distilled-router expert is the learned one, at the end of stage 1. "
          f"Tokens changing expert: of the recorded validation sample, the share whose expert in the routing used "
          f"for training last changed after 20% (50%, 80%) of the steps (routing fluctuation, the paper's Figures 2 "
          f"and 8).\n")


def health_note(rows: list[dict]) -> str:
  note = ("Router health (docs/router_health.md): mean gate, share of gates < 0.01, load balance (load entropy / "
          "ln N), largest expert's load and dropped tokens are the last logged training window's, of the run's worst "
          "MoE layer, mean over seeds; valid PPL increase without the layer: validation perplexity with that layer's "
          "expert outputs set to zero against the real one (the least contributing layer; health.contribution_batches "
          "validation batches). -- : the method has no MoE layer.\n")
  dead = [row["label"] for row in rows if _is_dead(row)]
  if dead:
    note += (f"\n**DEAD LAYER** ({', '.join(dead)}): by the health verdict, a MoE layer of this method does no "
             f"measurable work at the end of training (removing it costs < health.min_contribution of validation "
             f"perplexity, or two experts take > health.max_top2_load of the tokens). Its perplexity is that of a "
             f"dense model carrying a dead layer, not the method's result; do not compare it as one.\n")
  weak = [row["label"] for row in rows if (row.get("health") or {}).get("weak")]
  if weak:
    note += (f"\n**weak layer** ({', '.join(weak)}): a MoE layer whose removal costs < health.min_contribution of "
             f"validation perplexity (or whose routing is degenerate) while another MoE layer of the same model "
             f"works. A model with several MoE layers is judged as a whole: it is dead only when its MoE layers, all "
             f"removed at once, cost < health.min_contribution, or when every layer is under the line (a run "
             f"measured before the all-layers measure: from its per-layer numbers). A weak layer is reported, and "
             f"neither marks the run dead nor rejects its setting.\n")
  unrecorded = [row["label"] for row in rows if row.get("health") is None]
  if unrecorded:
    note += (f"\nNo health recorded ({', '.join(unrecorded)}): runs finished before health reporting; delete their "
             f"summary.json and rerun the comparison to resume them from their last checkpoint with it.\n")
  return note


def paired_section(differences: dict[str, dict], labels: dict[str, str], pairs: dict[str, str] | None = None) -> str:
  """The paired differences (``paired.paired_differences``) against dense (same seeds), or against each ablation's
  baseline (``compare.pairs``); "" when no method has its baseline's runs."""
  table = paired.markdown(differences, labels)
  if not table:
    return ""
  against = "its baseline" if pairs else "dense"
  return (f"## Paired against {against}\n\nEach method's run minus {against}'s run of the same seed (same data "
          "order), mean over the paired seeds and its 95% Student-t interval; \"lower\" / \"higher\" only where "
          "the interval excludes 0.\n\n" + table)


def sets_section(rows: list[dict], differences: dict[str, dict], pairs: dict[str, str] | None = None) -> str:
  """The named held-out sets (``data.eval_sets``, e.g. the union corpus's sources): each method's valid and test
  perplexity per set (mean over seeds) and the paired valid differences (``paired.paired_differences``); "" when
  the runs scored no named set."""
  scored = [row for row in rows if row.get("sets")]
  if not scored:
    return ""
  names = list(scored[0]["sets"])
  lines = ["| method | " + " | ".join(f"{name} valid / test PPL" for name in names) + " |",
           "|---" * (1 + len(names)) + "|"]
  lines += ["| " + " | ".join([row["label"], *(f"{row['sets'][n]['valid_mean']:.2f} / {row['sets'][n]['test_mean']:.2f}"
                                               for n in names)]) + " |" for row in scored]
  labels = {r["method"]: r["label"] for r in rows}
  set_differences = paired.sets_markdown(differences, labels)
  return ("\n## Per held-out set\n\nEach named set scored on its own (every token, as the splits), perplexity mean "
          "over seeds.\n\n" + "\n".join(lines) + "\n"
          + (f"\nPaired against {'its baseline' if pairs else 'dense'} (valid PPL, same seeds; 95% Student-t "
             f"interval):\n\n{set_differences}" if set_differences else ""))


def contrasts_section(records: list[dict], contrasts: list[tuple[str, str]], labels: dict[str, str]) -> str:
  """``compare.contrasts``: each A paired with B on their shared seeds (``paired.contrast_differences``); "" when
  none is set or none has runs of both."""
  table = paired.markdown(paired.contrast_differences(records, contrasts), labels)
  if not table:
    return ""
  return ("\n## Contrasts\n\nEach method's run minus the other's run of the same seed (`compare.contrasts`), mean "
          "over the paired seeds and its 95% Student-t interval; \"lower\" / \"higher\" only where the interval "
          "excludes 0.\n\n" + table)


def paired_sections(comparison: Comparison, rows: list[dict], records: list[dict], labels: dict[str, str]) -> str:
  """The paired section and the per-set section, from one pairing of the runs (``compare.pairs``, or dense), then
  the contrasts (``compare.contrasts``)."""
  pairs = pairs_of(comparison)
  differences = paired.paired_differences(records, pairs=pairs)
  return (paired_section(differences, labels, pairs) + sets_section(rows, differences, pairs)
          + contrasts_section(records, contrasts_of(comparison), labels))


def pairs_of(comparison: Comparison) -> dict[str, str] | None:
  """``compare.pairs`` as {ablation: baseline} (None: pair every method with dense); a bad value is a ConfigError."""
  return paired.parse_pairs(comparison.settings.pairs, comparison.method_names) or None


def contrasts_of(comparison: Comparison) -> list[tuple[str, str]]:
  """``compare.contrasts`` as [(A, B), ...]; a bad value is a ConfigError."""
  return paired.parse_contrasts(comparison.settings.contrasts, comparison.method_names)


def runs_json(records: list[dict]) -> list[dict]:
  """The run records as comparison.json's ``runs`` holds them: each record with its summary as summary.json has it."""
  return [{**record, "summary": record["summary"].to_json()} for record in records]


def write_reports(comparison: Comparison, records: list[dict], workdir: pathlib.Path) -> list[dict]:
  """Writes DIR/comparison.json, DIR/comparison.md, DIR/convergence.png and DIR/fluctuation.png (when runs
  recorded their routing); returns the method rows."""
  workdir = pathlib.Path(workdir)
  rows = method_rows(records)
  (workdir / "comparison.json").write_text(json.dumps(
      {"config": json.loads(comparison.config.to_json_best_effort()), "methods": rows, "runs": runs_json(records)},
      indent=2))
  (workdir / "comparison.md").write_text(
      "# Comparison\n\n" + budget_note(comparison, rows) + devices_note(rows) + "\n" + markdown_table(rows) + "\n"
      + health_note(rows) + paired_sections(comparison, rows, records, {r["method"]: r["label"] for r in rows})
      + write_convergence_plot(rows, workdir / "convergence.png")
      + write_fluctuation_plot(rows, workdir / "fluctuation.png"))
  return rows

"""The analysis files of a run, in ``workdir/analysis/``.

  ``cohesion_{split}_step{N}.json`` / ``.md``: per layer and expert, the most frequent tokens (Table 7);
  ``load_{split}_step{N}.json``: per layer, expert load, its entropy and balance, the mean gate and the share of
  gates < 0.01 (the router-health metrics under the inference routing);
  ``fluctuation.json`` / ``fluctuation.png``: the fluctuation summary and curves of the run's records (top-k: of
  each token's first choice and of its set of k choices).
All use the inference routing over every token of ``split``, except the fluctuation files, which read
the routing records (training and inference routing of the fixed sample).
"""
from __future__ import annotations

import json
import pathlib

import jax

from stablemoe_jax.analysis import cohesion, fluctuation, plot
from stablemoe_jax.analysis.records import ROUTINGS, RecordsNotFoundError, load_records
from stablemoe_jax.analysis.routes import analysis_model, make_split_router, sorted_layers
from stablemoe_jax.core.run_view import RunView
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.parallel import sharding as sharding_lib


def global_inputs(run: RunView, batch: dict) -> tuple[jax.Array, ...]:
  """The model's inputs (``task.model_inputs``) of a batch every process holds whole, as global arrays."""
  return run.task.model_inputs(mesh_lib.to_global(mesh_lib.local_rows(batch), run.mesh))


def split_routing_counts(run: RunView, params, split: str) -> dict[str, cohesion.RoutingCounts]:
  """Routes every token of ``split`` with the inference routing; {layer: counts} in model order."""
  cfg = run.config
  route = mesh_lib.under_mesh(run.mesh, jax.jit(
      make_split_router(analysis_model(run.task, run.settings.model)),
      in_shardings=(run.param_shardings, sharding_lib.batch_sharding(run.mesh)),
      out_shardings=sharding_lib.replicated(run.mesh)))
  counts: dict[str, cohesion.RoutingCounts] = {}
  for batch in run.task.eval_batches(run.data, run.settings, split):
    routed = jax.device_get(route(params, global_inputs(run, batch)))
    for layer, (expert_index, gate) in routed.items():
      layer_counts = counts.setdefault(layer, cohesion.RoutingCounts(cfg.model.moe.num_experts, cfg.model.vocab_size))
      token_ids, mask = run.task.routing_tokens(layer, batch)
      layer_counts.add(token_ids, expert_index, gate, mask=mask)
  if not counts:
    raise ValueError("the model has no MoE layer to analyse (model.moe.enabled is False).")
  return {layer: counts[layer] for layer in sorted_layers(counts)}


def fluctuation_report(workdir: pathlib.Path, out_dir: pathlib.Path) -> dict | None:
  """Writes fluctuation.json and fluctuation.png from the run's records; None if it has none."""
  try:
    records = load_records(workdir)
  except RecordsNotFoundError:
    return None
  summary = {routing: fluctuation.summarize(records, routing) for routing in ROUTINGS}
  (out_dir / "fluctuation.json").write_text(json.dumps(summary, indent=2))
  curves = [(f"{routing} routing", *fluctuation.curve_from_records(records, routing)) for routing in ROUTINGS]
  if records.top_k > 1:  # the first choice's curves (above) and the k-set's
    curves += [(f"{routing} routing, set of {records.top_k}", *fluctuation.curve_from_records(records, routing, True))
               for routing in ROUTINGS]
  plot.plot_curves(curves, out_dir / "fluctuation.png", title=f"routing fluctuation: {workdir.resolve().name}")
  return summary


def write_report(run: RunView, params, split: str, step: int) -> dict:
  """Computes the analysis of ``params`` (the checkpoint of ``step``) and, on the chief, writes its files.

  Every process must call it (the routing pass is a collective). Returns a short summary.
  """
  counts = split_routing_counts(run, params, split)
  top = {layer: c.top_tokens(run.config.analysis.top_tokens, run.data.tokenizer.id_to_token)
         for layer, c in counts.items()}
  load = {layer: c.load_stats() for layer, c in counts.items()}
  out_dir = run.workdir / "analysis"
  result = {"step": step, "split": split, "analysis_dir": str(out_dir),
            "load_entropy": {layer: stats["load_entropy"] for layer, stats in load.items()},
            "health": {layer: {name: stats[name] for name in ("mean_gate", "low_gate_fraction", "load_balance",
                                                              "max_load")} for layer, stats in load.items()}}
  if jax.process_index() != 0:
    return result
  out_dir.mkdir(parents=True, exist_ok=True)
  stem = f"{split}_step{step}"
  (out_dir / f"cohesion_{stem}.json").write_text(json.dumps(top, indent=2))
  (out_dir / f"cohesion_{stem}.md").write_text(
      f"# Most frequent {split} tokens per expert, step {step} (inference routing)\n\n" + cohesion.markdown_table(top))
  (out_dir / f"load_{stem}.json").write_text(json.dumps(load, indent=2))
  summary = fluctuation_report(run.workdir, out_dir)
  if summary is not None:
    result["fluctuation"] = {routing: summary[routing]["all_layers"] for routing in ROUTINGS}
  return result

"""Runs every (method, seed) of a comparison in ``DIR/<method>/seed<k>``, resuming where it stopped."""
from __future__ import annotations

import json
import os
import pathlib
import time

import jax
import ml_collections

from stablemoe_jax import flops as flops_lib
from stablemoe_jax.analysis import fluctuation, records as records_lib
from stablemoe_jax.compare.methods import METHODS, method_configs
from stablemoe_jax.train import loop
from stablemoe_jax.train.metrics import read_metrics


def run_dir(workdir: pathlib.Path, method: str, seed_index: int) -> pathlib.Path:
  return pathlib.Path(workdir) / method / f"seed{seed_index}"


def _share_prepared_data(workdir: pathlib.Path, directory: pathlib.Path) -> None:
  """Points ``directory/data`` at ``workdir/data``: methods change only model.*, so one tokenized corpus serves all."""
  directory.mkdir(parents=True, exist_ok=True)
  (workdir / "data").mkdir(parents=True, exist_ok=True)
  link = directory / "data"
  if not link.exists() and not link.is_symlink():
    link.symlink_to(os.path.relpath(workdir / "data", directory))


def model_costs(config: ml_collections.ConfigDict, directory: pathlib.Path) -> dict:
  """Shared / expert parameter counts and analytic forward FLOPs per token (top-1 active) of a run's model."""
  exp = loop.Experiment(config, directory)
  try:
    params = jax.eval_shape(exp.init_state).params
  finally:
    exp.checkpointer.close()
  counts = flops_lib.param_counts(params)
  return {"shared_params": counts["shared"], "expert_params": counts["expert"], "total_params": counts["total"],
          "flops_per_token": flops_lib.forward_flops_per_token(params, exp.config.train.seq_len)}


def validation_curve(directory: pathlib.Path, summary: dict) -> list[list[float]]:
  """[[training seconds, valid perplexity], ...] at every in-training validation, then the final one."""
  curve = [[r["train_seconds"], r["valid/perplexity"]] for r in read_metrics(directory)
           if "valid/perplexity" in r and "train_seconds" in r]
  curve.append([summary["train_seconds"], summary["valid"]["perplexity"]])
  return curve


def routing_fluctuation(directory: pathlib.Path) -> dict[str, float] | None:
  """Shares of recorded tokens whose training-time expert last changed after 20/50/80% of training; None unrecorded."""
  try:
    return fluctuation.shares_from_workdir(directory)
  except records_lib.RecordsNotFoundError:
    return None


def run_all(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, log=print) -> list[dict]:
  """Trains (or finds finished) every method x seed; returns one record per run, in order.

  Every method's config is built and validated before the first run starts. A run whose
  ``summary.json`` exists is not redone; an interrupted one resumes from its last checkpoint.
  """
  workdir = pathlib.Path(workdir)
  configs = method_configs(config)
  seeds = config.compare.seeds
  total = len(configs) * seeds
  records = []
  for m, (name, method_config) in enumerate(configs.items()):
    costs = None
    for k in range(seeds):
      index = m * seeds + k + 1
      directory = run_dir(workdir, name, k)
      run_config = ml_collections.ConfigDict(method_config.to_dict())
      run_config.seed = config.seed + k
      summary_path = directory / "summary.json"
      _share_prepared_data(workdir, directory)
      if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        status = "finished earlier"
      else:
        log(f"[{index}/{total}] {name} seed {k}: training in {directory}", flush=True)
        started = time.time()
        summary = loop.train_and_evaluate(run_config, directory)
        status = f"trained in {time.time() - started:.0f} s"
      if costs is None:
        costs = model_costs(run_config, directory)
      bleu = f", test BLEU {summary['bleu']['average']:.2f}" if "bleu" in summary else ""
      log(f"[{index}/{total}] {name} seed {k}: {status}; valid ppl {summary['valid']['perplexity']:.2f}, "
          f"test ppl {summary['test']['perplexity']:.2f}{bleu}, {summary.get('tokens_per_second', 0):.0f} tokens/s",
          flush=True)
      records.append({"method": name, "label": METHODS[name].label, "seed_index": k, "seed": run_config.seed,
                      "overrides": METHODS[name].overrides, "workdir": str(directory), "summary": summary,
                      "curve": validation_curve(directory, summary),
                      "fluctuation": routing_fluctuation(directory), **costs})
  return records

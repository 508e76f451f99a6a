"""Runs every (method, seed) of a comparison in ``DIR/<method>/seed<k>``, resuming where it stopped."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import time

import jax
import ml_collections
import numpy as np

from stablemoe_jax.analysis import fluctuation, records as records_lib
from stablemoe_jax.compare.comparison import Comparison
from stablemoe_jax.compare.methods import METHODS, method_configs
from stablemoe_jax.core.errors import NonFiniteLossError
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.experiment import loop
from stablemoe_jax.models import flops as flops_lib
from stablemoe_jax.models import routers
from stablemoe_jax.models.transformer import has_moe_layers
from stablemoe_jax.train import health
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
  """Shared / expert parameter counts and analytic forward FLOPs per token of a run's model (the active count: each
  of a token's k routed choices one expert FFN, every shared expert; ``flops.forward_flops_per_token``)."""
  exp = loop.Experiment(config, directory)
  try:
    params = jax.eval_shape(exp.init_state).params
  finally:
    exp.checkpointer.close()
  counts = flops_lib.param_counts(params)
  model = exp.settings.model
  top_k = routers.top_k(model.moe) if has_moe_layers(model) else 1
  return {"shared_params": counts["shared"], "expert_params": counts["expert"], "total_params": counts["total"],
          "flops_per_token": flops_lib.forward_flops_per_token(params, exp.settings.train.seq_len, top_k=top_k)}


def validation_curves(records: list[dict], summary: RunSummary, tokens_per_step: int,
                      final_measured_alike: bool = True) -> dict[str, list[list[float]]]:
  """From the run's metrics.jsonl records: at every in-training validation, then the final one, ``"curve"``
  [[training seconds, valid perplexity], ...] and ``"token_curve"`` [[training tokens, valid perplexity], ...].

  ``final_measured_alike``: whether the final validation scores what the in-training ones score. When it does not
  (in-training on the first ``train.eval_batches`` batches, the final on the whole split), the final point is left
  off: a curve of two measures would show their difference as a change in the model (translation's first 10
  batches hold only de-en's and fr-en's pairs). It stays the only point of a run that validated nowhere else."""
  valid = [r for r in records if "valid/perplexity" in r]
  final = summary.valid["perplexity"]
  # Scored tokens (translation: real target tokens) where the run logged them, else every position of its steps.
  counted = [r["trained_tokens"] for r in records if "trained_tokens" in r and r["step"] == summary.steps]
  tokens = lambda r: r.get("trained_tokens", r["step"] * tokens_per_step)
  with_final = final_measured_alike or not valid
  return {"curve": [[r["train_seconds"], r["valid/perplexity"]] for r in valid if "train_seconds" in r]
                   + ([[summary.train_seconds, final]] if with_final else []),
          "token_curve": [[tokens(r), r["valid/perplexity"]] for r in valid]
                         + ([[counted[-1] if counted else summary.steps * tokens_per_step, final]]
                            if with_final else [])}


def split_batches(run_config: ml_collections.ConfigDict, summary: RunSummary) -> int | None:
  """How many batches the whole validation split has, where the run tells: the final validation's count when it
  scored the whole split (``eval.max_batches`` 0) and recorded it; for a language-model run from before that was
  recorded, its non-overlapping blocks of ``eval.seq_len`` predictions in ``eval.batch_size`` rows; else None."""
  valid, whole = summary.valid, int(run_config.eval.max_batches) <= 0
  if "batches" in valid:
    return valid["batches"] if whole or valid["batches"] < int(run_config.eval.max_batches) else None
  mode = summary.eval or {}
  if whole and mode.get("mode") == "blocks" and mode.get("stride") in (0, mode.get("seq_len")):
    rows = -(-valid["tokens"] // mode["seq_len"])
    return -(-rows // int(run_config.eval.batch_size))
  return None


def _prefix(requested: int, total: int | None) -> int:
  """The batches an evaluation of ``requested`` batches (<= 0: all) scores of a split of ``total``; 0: all of it."""
  return 0 if requested <= 0 or (total is not None and requested >= total) else requested


def validation_scope(run_config: ml_collections.ConfigDict, summary: RunSummary) -> tuple[int, bool]:
  """The validation batches each point of a run's curves scores (``train.eval_batches``; 0: the whole split), and
  whether the final validation (``eval.max_batches``) scores the same ones."""
  total = split_batches(run_config, summary)
  in_training = _prefix(int(run_config.train.eval_batches), total)
  return in_training, in_training == _prefix(int(run_config.eval.max_batches), total)


TRAIN_LOSS_TAIL = 0.2  # the training loss reported: the mean logged task loss over the last 20% of the steps


def training_loss(records: list[dict], steps: int) -> float | None:
  """The mean of the logged training task loss (the model's own loss, without balance or distillation terms;
  label-smoothed where the task smooths) over the windows logged in the last ``TRAIN_LOSS_TAIL`` of ``steps``: how
  well the model fits the training text, which validation alone does not say. None if no window was logged there."""
  tail = [r["task_loss"] for r in records if "task_loss" in r and r["step"] > (1 - TRAIN_LOSS_TAIL) * steps]
  return float(np.mean(tail)) if tail else None


def routing_fluctuation(directory: pathlib.Path) -> dict | None:
  """Shares of recorded tokens whose training-time expert last changed after 20/50/80% of training, and the whole
  cumulative curve (the paper's Figure 2: "percent" of training [K], "share" of tokens settled by then [K]), so
  that a run's figure can be drawn from its exported files alone; None when the run has no routing records."""
  try:
    return fluctuation.shares_and_curve(records_lib.load_records(directory))
  except records_lib.RecordsNotFoundError:
    return None


# A finished run's small result files: what a later session needs to skip the run (checkpoints are not kept).
RESULT_FILES = ("summary.json", "metrics.jsonl", "fluctuation.json")


def results_dir(comparison: Comparison) -> pathlib.Path | None:
  """``compare.results_dir`` as a path (None if unset): finished runs' small files are copied there, and a run
  whose summary.json is there is not redone (commit that folder to carry a sweep across machines)."""
  path = comparison.settings.results_dir
  return pathlib.Path(path) if path else None


def export_run(directory: pathlib.Path, target: pathlib.Path) -> None:
  """Copies a finished run's RESULT_FILES to ``target`` (its routing fluctuation summarised as fluctuation.json)."""
  shares = routing_fluctuation(directory)
  if shares is not None and not (directory / "fluctuation.json").exists():
    (directory / "fluctuation.json").write_text(json.dumps(shares, indent=2))
  _copy_files(directory, target, RESULT_FILES)


def _copy_files(directory: pathlib.Path, target: pathlib.Path, names: tuple[str, ...]) -> None:
  """Copies those of ``names`` that exist in ``directory`` to ``target``."""
  target.mkdir(parents=True, exist_ok=True)
  for name in names:
    if (directory / name).exists():
      (target / name).write_bytes((directory / name).read_bytes())


def find_finished(directory: pathlib.Path, exported: pathlib.Path | None,
                  name: str = "summary.json") -> pathlib.Path | None:
  """The folder holding this run's ``name`` (summary.json, or DIVERGED_FILE): the run directory, else its copy
  under the results folder."""
  for candidate in (directory, exported):
    if candidate is not None and (candidate / name).exists():
      return candidate
  return None


DIVERGED_FILE = "diverged.json"  # {"step", "message"}: the run stopped on a non-finite loss or gradient


class RunDiverged(NonFiniteLossError):
  """A comparison's run stopped by a non-finite loss or gradient, now or in an earlier call (its DIVERGED_FILE,
  which keeps it from being trained again). ``step``: where; ``source``: the folder holding the file."""

  def __init__(self, record: dict, source: pathlib.Path):
    super().__init__(f"the run in {source} diverged: {record['message']} (to train it again from its last "
                     f"checkpoint, remove its {DIVERGED_FILE} from the run folder and from compare.results_dir)",
                     step=record["step"])
    self.source = source


def _record_divergence(error: NonFiniteLossError, directory: pathlib.Path, exported: pathlib.Path | None) -> dict:
  """Writes the run's DIVERGED_FILE (and, with ``exported``, copies it and metrics.jsonl there); returns it."""
  record = {"step": error.step, "message": str(error)}
  (directory / DIVERGED_FILE).write_text(json.dumps(record, indent=2))
  if exported is not None:
    _copy_files(directory, exported, (DIVERGED_FILE, "metrics.jsonl"))
  return record


LOCK_FILE = ".train.lock"


@contextlib.contextmanager
def training_lock(directory: pathlib.Path):
  """Yields True while this process holds the run's lock, False if another process is training it (two comparison
  commands on one workdir then share the runs instead of training one twice)."""
  with open(directory / LOCK_FILE, "a") as handle:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      yield False
      return
    try:
      yield True
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)


def judged(summary: RunSummary, source: pathlib.Path) -> RunSummary:
  """``summary`` with its health verdict (``ok``, ``dead_layers``, ``verdict``) made again by today's rule
  (``health.judge_health``, the last window's load read from ``source``'s metrics.jsonl): runs finished before
  the rule changed are judged as a new run would be."""
  if not summary.health:
    return summary
  verdict = health.judge_health(summary.health, read_metrics(source))
  return summary.with_health({**summary.health, **verdict})


def write_verdict(source: pathlib.Path) -> bool:
  """Writes :func:`judged`'s verdict (``ok``, ``dead_layers``, ``verdict``) into ``source/summary.json``, every other
  key as it was (the raw measures; what the guard flagged in training, an old guard's ``reasons`` included), so the
  file read by hand says what the reports say. True when the file changed."""
  path = pathlib.Path(source) / "summary.json"
  text = path.read_text()
  updated = json.dumps(judged(RunSummary.from_json(json.loads(text)), pathlib.Path(source)).to_json(), indent=2)
  if updated == text:
    return False
  path.write_text(updated)
  return True


def _load_summary(source: pathlib.Path) -> RunSummary:
  return judged(RunSummary.load(source / "summary.json"), source)


def train_run(run_config: ml_collections.ConfigDict, workdir: pathlib.Path, relative: str, log, tag: str,
              exported_root: pathlib.Path | None = None, train: bool = True):
  """Trains the run ``workdir/relative`` unless it finished (there or under ``exported_root/relative``).

  Returns (summary, the folder its files are read from, status), or None when it has not finished and ``train``
  is false or another process holds its lock (is training it). A run trained here is exported to
  ``exported_root/relative`` when that is set. Raises RunDiverged when the run stops on a non-finite loss or
  gradient, here or in an earlier call (then without training it again).
  """
  directory = pathlib.Path(workdir) / relative
  exported = None if exported_root is None else exported_root / relative
  _share_prepared_data(pathlib.Path(workdir), directory)
  diverged = find_finished(directory, exported, DIVERGED_FILE)
  if diverged is not None:
    raise RunDiverged(json.loads((diverged / DIVERGED_FILE).read_text()), diverged)
  source = find_finished(directory, exported)
  if source is not None:
    status = "finished earlier" if source == directory else f"finished earlier ({source})"
    if exported is not None and source == directory and not (exported / "summary.json").exists():
      export_run(directory, exported)
    return _load_summary(source), source, status
  if not train:
    return None
  with training_lock(directory) as mine:
    if not mine:
      log(f"{tag}: another process is training it in {directory}; skipped", flush=True)
      return None
    if (directory / "summary.json").exists():  # finished by that process between the check and the lock
      return _load_summary(directory), directory, "finished earlier"
    log(f"{tag}: training in {directory}", flush=True)
    started = time.time()
    try:
      summary = loop.train_and_evaluate(run_config, directory)
    except NonFiniteLossError as error:
      raise RunDiverged(_record_divergence(error, directory, exported), directory) from error
  if exported is not None:
    export_run(directory, exported)
  return judged(summary, directory), directory, f"trained in {time.time() - started:.0f} s"


def run_record(name: str, run_config: ml_collections.ConfigDict, seed_index: int, source: pathlib.Path,
               summary: RunSummary, costs: dict) -> dict:
  """One run's record for the report: its summary, curve, routing fluctuation and its method's costs."""
  saved = source / "fluctuation.json"
  shares = json.loads(saved.read_text()) if saved.exists() else routing_fluctuation(source)
  records = read_metrics(source)
  curve_batches, final_measured_alike = validation_scope(run_config, summary)
  return {"method": name, "label": METHODS[name].label, "seed_index": seed_index, "seed": run_config.seed,
          "overrides": METHODS[name].overrides, "workdir": str(source), "summary": summary,
          "fluctuation": shares, "train_loss": training_loss(records, summary.steps),
          "curve_batches": curve_batches,
          **validation_curves(records, summary, run_config.train.batch_size * run_config.train.seq_len,
                              final_measured_alike), **costs}


def log_result(log, tag: str, status: str, summary: RunSummary) -> None:
  bleu = f", test BLEU {summary.bleu['average']:.2f}" if summary.bleu is not None else ""
  weak = (summary.health or {}).get("weak_layers")  # > 1 MoE layer: under the line while another works
  weak = f"; weak layer: {', '.join(weak)} (the model is alive)" if weak else ""
  log(f"{tag}: {status}; valid ppl {summary.valid['perplexity']:.2f}, "
      f"test ppl {summary.test['perplexity']:.2f}{bleu}, {summary.tokens_per_second or 0:.0f} tokens/s{weak}",
      flush=True)


def run_all(comparison: Comparison, workdir: str | pathlib.Path, log=print,
            train: bool = True) -> list[dict]:
  """Trains (or finds finished) every method x seed; returns one record per run, in order (with ``train`` false,
  only the finished runs: ``compare.report_only``).

  Every method's config is built and validated before the first run starts. A run whose
  ``summary.json`` exists (in ``DIR/<method>/seed<k>`` or under ``compare.results_dir``) is not redone;
  an interrupted one resumes from its last checkpoint.
  """
  workdir = pathlib.Path(workdir)
  configs, config = method_configs(comparison), comparison.config
  seeds = comparison.settings.seeds
  total = len(configs) * seeds
  exported_root = results_dir(comparison)
  records = []
  for m, (name, method_config) in enumerate(configs.items()):
    costs = None
    for k in range(seeds):
      tag = f"[{m * seeds + k + 1}/{total}] {name} seed {k}"
      run_config = ml_collections.ConfigDict(method_config.to_dict())
      run_config.seed = config.seed + k
      relative = f"{name}/seed{k}"
      found = train_run(run_config, workdir, relative, log, tag, exported_root, train)
      if found is None:  # not finished (report only) or another process is training it: not in this report
        continue
      summary, source, status = found
      if costs is None:
        costs = model_costs(run_config, workdir / relative)
      log_result(log, tag, status, summary)
      records.append(run_record(name, run_config, k, source, summary, costs))
  return records

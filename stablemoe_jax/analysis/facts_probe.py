"""The facts regime's probe (``data.corpus=facts``): at every evaluation point and at the end, every fact's recall
and the experts its value-predicting token goes to; at the end, forgetting by route change.

Per point (``workdir/facts/step_NNNNNNN.npz``, N = the facts' lines, L = MoE layers, k = experts a token):

    recalled          bool    [N]        every value token of the line is the model's greedy choice (inference
                                         routing, as evaluation scores)
    value_nll         float32 [N]        the line's value tokens' mean NLL
    train_routes      int32   [L, N, k]  the value-predicting token's experts under the training routing of that step
                                         (stage 1's learned routing before ``train.stage1_steps``, dropout off)
    inference_routes  int32   [L, N, k]  ... under the inference routing

The value-predicting token is the one before the value's first token (``data/lm/facts.py``: a name piece in the
``attribute_first`` layout, the attribute token in ``name_first``). Logged at each point (``facts/...`` keys of
``metrics.jsonl``): recall, value NLL, and per layer how many experts the value-predicting tokens use (the
normalised entropy of their inference-routing load, and exp of it) beside the load balance of every token of the
lines. The summary's ``facts`` adds the forgetting counts (``analysis/forgetting.py``) over the training routes.
"""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from stablemoe_jax.analysis import forgetting
from stablemoe_jax.analysis.cohesion import load_balance
from stablemoe_jax.analysis.routes import analysis_model, sorted_layers, sown_choices
from stablemoe_jax.core.run_view import RunView
from stablemoe_jax.models.routing import ROUTING
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.parallel import sharding as sharding_lib

SPLIT = "valid"  # every line once, in fact order


def facts_dir(workdir) -> pathlib.Path:
  return pathlib.Path(workdir) / "facts"


def point_steps(directory: pathlib.Path) -> list[int]:
  return sorted(int(p.stem.split("_")[1]) for p in directory.glob("step_*.npz"))


def _point_path(directory: pathlib.Path, step: int) -> pathlib.Path:
  return directory / f"step_{step:07d}.npz"


def recall_from_logits(argmax: np.ndarray, targets: np.ndarray, positions: np.ndarray) -> np.ndarray:
  """bool [N]: line i is recalled when the greedy id equals the target at each of its value positions.

  argmax, targets: [P] (flat positions of the evaluation batches); positions: int [N, value_tokens]."""
  return (np.asarray(argmax)[positions] == np.asarray(targets)[positions]).all(axis=1)


def make_fact_measure(model, train_model, stage1_only: bool, seed: int):
  """``(params, inputs [B, S], targets [B, S], in_stage1) -> (argmax int32 [B, S], nll float32 [B, S],
  {layer: training choices int32 [B*S, k]}, {layer: inference choices int32 [B*S, k]})``.

  ``model``: the run's model (evaluated with dropout off, as evaluation does: the learned routing when the run is
  stage 1 only); ``train_model``: the same without dropout, applied in training mode at stage ``in_stage1``."""
  key = jax.random.key(seed)

  def measure(params, inputs, targets, in_stage1):
    output, sown = model.apply({"params": params}, inputs, jnp.array(stage1_only), deterministic=True,
                               mutable=[ROUTING])
    logits = output.logits()
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    _, train_sown = train_model.apply({"params": params}, inputs, in_stage1, deterministic=False,
                                      rngs={"dropout": key}, mutable=[ROUTING])
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), nll, sown_choices(train_sown), sown_choices(sown)

  return measure


class FactsProbe:
  """Measures the facts at evaluation points and at the end (``measure``); drops points past ``start_step`` (a
  resumed run measures them again, identically). Every process makes the same calls; only the chief writes.

  Args:
    run: the run (its data a ``facts.FactsData``; otherwise the probe is disabled).
    start_step: the step the run starts (or resumes) from.
  """

  def __init__(self, run: RunView, start_step: int):
    self.enabled = hasattr(run.data, "value_positions")
    if not self.enabled:
      return
    cfg = run.config
    self._steps, self._stage1_steps = cfg.train.steps, cfg.train.stage1_steps
    self._num_experts = cfg.model.moe.num_experts
    self._directory = facts_dir(run.workdir)
    self._is_chief = jax.process_index() == 0
    self._mesh = run.mesh
    batch_size, seq_len = cfg.eval.batch_size, cfg.eval.seq_len
    self._batches = list(run.data.eval_batches(SPLIT, batch_size, seq_len))
    self._lines, self._positions = run.data.value_positions(SPLIT, batch_size, seq_len)
    self._targets = np.concatenate([b["targets"] for b in self._batches]).ravel()
    self._real = np.concatenate([b["weights"] for b in self._batches]).ravel() > 0
    measure = make_fact_measure(run.model, analysis_model(run.task, run.settings.model), cfg.train.stage1_steps >= cfg.train.steps,
                                cfg.seed)
    self._measure = mesh_lib.under_mesh(run.mesh, jax.jit(
        measure, in_shardings=(run.param_shardings, *[sharding_lib.batch_sharding(run.mesh)] * 2, None),
        out_shardings=sharding_lib.replicated(run.mesh)))
    if self._is_chief:
      self._directory.mkdir(parents=True, exist_ok=True)
      for step in point_steps(self._directory):
        if step > start_step:
          _point_path(self._directory, step).unlink()

  def measure(self, params, step: int) -> dict:
    """Measures every fact with ``params`` (after ``step`` updates), writes the point, returns its metrics
    (``{"facts/recall": ..., ...}``)."""
    argmax, nll, train, inference = [], [], [], []
    in_stage1 = jnp.array(step < self._stage1_steps)
    for batch in self._batches:
      local = mesh_lib.to_global(mesh_lib.local_rows(batch), self._mesh)
      a, n, t, i = jax.device_get(self._measure(params, local["inputs"], local["targets"], in_stage1))
      argmax.append(a.ravel())
      nll.append(n.ravel())
      train.append(t)
      inference.append(i)
    argmax, nll = np.concatenate(argmax), np.concatenate(nll)
    layers = sorted_layers(train[0])
    value = self._positions[:, 0]
    train_routes = _stack_routes(train, layers, value)
    inference_routes = _stack_routes(inference, layers, value)
    recalled = recall_from_logits(argmax, self._targets, self._positions)
    value_nll = nll[self._positions].mean(axis=1).astype(np.float32)
    all_inference = {layer: np.concatenate([b[layer] for b in inference])[self._real] for layer in layers}
    metrics = {"facts/recall": float(recalled.mean()), "facts/value_nll": float(value_nll.mean())}
    for index, layer in enumerate(layers):
      value_load = np.bincount(inference_routes[index].ravel(), minlength=self._num_experts)
      value_balance = load_balance(value_load)
      metrics[f"facts/{layer}/value_balance"] = value_balance
      metrics[f"facts/{layer}/value_experts"] = float(np.exp(value_balance * np.log(self._num_experts)))
      metrics[f"facts/{layer}/token_balance"] = load_balance(
          np.bincount(all_inference[layer].ravel(), minlength=self._num_experts))
    if self._is_chief:
      np.savez(_point_path(self._directory, step), recalled=recalled, value_nll=value_nll, train_routes=train_routes,
               inference_routes=inference_routes, lines=self._lines, layers=np.array(layers, dtype=str))
    return metrics

  def finish(self, params, step: int) -> dict:
    """The last point and the run's facts summary (also ``workdir/facts/summary.json``)."""
    metrics = self.measure(params, step)
    summary = summarize(self._directory, self._steps) if self._is_chief else {}
    summary["final"] = metrics
    if self._is_chief:
      (self._directory / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _stack_routes(per_batch: list[dict], layers: list[str], positions: np.ndarray) -> np.ndarray:
  """int32 [L, N, k]: each layer's choices at ``positions`` of the concatenated batches (L = 0: [0, N, 1])."""
  if not layers:
    return np.zeros((0, len(positions), 1), np.int32)
  return np.stack([np.concatenate([b[layer] for b in per_batch])[positions] for layer in layers]).astype(np.int32)


def load_points(directory: pathlib.Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(steps int [K], recalled bool [K, N], training routes int [K, L, N, k]) of a run's points."""
  steps = point_steps(directory)
  if not steps:
    raise FileNotFoundError(f"no facts points in {directory}; train with data.corpus=facts first.")
  points = [np.load(_point_path(directory, step)) for step in steps]
  return (np.array(steps), np.stack([p["recalled"] for p in points]),
          np.stack([p["train_routes"] for p in points]))


def summarize(directory: pathlib.Path, total_steps: int) -> dict:
  """Recall over the points, forgetting by route change (training routing), and the share of facts whose route
  still changes after 20 / 50 / 80% of ``total_steps``."""
  steps, recalled, choices = load_points(directory)
  routes = forgetting.route_ids(choices)
  return {
      "points": steps.tolist(),
      "lines": int(recalled.shape[1]),
      "recall_curve": recalled.mean(axis=1).round(5).tolist(),
      "recall_at": forgetting.recall_at(steps, recalled, total_steps=total_steps),
      "forgetting": forgetting.count_forgetting(recalled, routes).as_dict(),
      "route_changing_after": forgetting.route_changing_after(steps, routes, total_steps),
  }

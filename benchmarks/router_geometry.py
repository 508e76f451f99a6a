"""Geometry of the first MoE layer's input while training: why a sigmoid gate on ``s = h E^T`` can die.

Trains the config's model from its init and, every ``--every`` steps, on one fixed training batch,
prints a JSON line with: the norm of the batch-mean MoE input ``|mean_t h_t|`` and the mean ``|h_t|``
(their ratio near 1 means every token points the same way), the range over experts of the scores'
shared part ``mean_t s[t, i]`` (``E_i . mean_t h_t`` with the paper's dot product), the spread of a score
over tokens (std over t of ``s[t, i] - mean_t s[t, i]``, averaged over i), the mean gate
``sigmoid(max_i s[t, i])`` and how far the shared parts moved per step since the last line. The scores are
the router's own: ``h E^T``, or ``cos(P h, E) / tau`` under ``model.moe.stablemoe.affinity=cosine`` (the CPU
default). docs/router_health.md shows it for the paper's router (its loss and dot-product routing):

  python -m benchmarks.router_geometry --config configs/default.py --workdir /tmp/geometry \
      --config.model.moe.stablemoe.balance_scope=assigned --config.model.moe.stablemoe.affinity=dot \
      --config.model.moe.stablemoe.cosine_dim=0 --config.train.learning_rate=4e-3 --steps 30
"""
from __future__ import annotations

import json
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags

from stablemoe_jax.cli import run_app
from stablemoe_jax.experiment.loop import Experiment
from stablemoe_jax.models import stablemoe_router
from stablemoe_jax.parallel import mesh as mesh_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the corpus is prepared (a run's workdir can be reused).")
_STEPS = flags.DEFINE_integer("steps", 30, "Train steps.")
_EVERY = flags.DEFINE_integer("every", 5, "Measure every this many steps.")


def moe_input_geometry(exp: Experiment, params, batch, layer: str = "moe_0") -> dict[str, jax.Array]:
  """Scalars of the MoE input h [T, d] of ``layer`` on ``batch`` and of its router's scores s [T, N]
  (shared_score: [N]). The scores are the router's own (``h E^T``, or with ``affinity=cosine`` ``cos(P h, E) /
  tau``), so the shared part ``mean_t s[t, i]`` is ``E_i . mean_t h_t`` for the paper's dot product."""
  h, scores = _capture_input_and_scores(exp, params, batch, layer)
  mean_h = h.mean(axis=0)
  shared = scores.mean(axis=0)  # [N]
  return {"mean_input_norm": jnp.linalg.norm(mean_h), "input_norm": jnp.linalg.norm(h, axis=-1).mean(),
          "shared_score": shared, "token_spread": (scores - shared).std(axis=0).mean(),
          "mean_gate": jax.nn.sigmoid(scores.max(axis=-1)).mean()}


def _capture_input_and_scores(exp: Experiment, params, batch, layer: str) -> tuple[jax.Array, jax.Array]:
  """The input x [B, S, d] of MoE layer ``layer`` as h [T, d], and the scores [T, N] its greedy-sigmoid router
  (StableMoE's stage 1) hands to its policy, via a forward with that layer's call and the policy intercepted."""
  captured, inside = {}, []

  def interceptor(next_fun, args, kwargs, context):
    if context.module.name != layer or context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    captured["x"] = args[0]
    inside.append(True)
    try:
      return next_fun(*args, **kwargs)
    finally:
      inside.pop()

  assign = stablemoe_router.GreedySigmoid.assign

  def recording_assign(policy, scores, *args, **kwargs):
    if inside:
      captured["scores"] = scores
    return assign(policy, scores, *args, **kwargs)

  with nn.intercept_methods(interceptor), mock.patch.object(stablemoe_router.GreedySigmoid, "assign", recording_assign):
    exp.model.apply({"params": params}, batch["inputs"], jnp.array(True), deterministic=True)
  if "scores" not in captured:
    raise ValueError(f"layer {layer}'s router does not score tokens with a greedy sigmoid (model.moe.router="
                     f"{exp.config.model.moe.router!r}); this benchmark measures the stablemoe router.")
  x = captured["x"]
  return x.reshape(-1, x.shape[-1]).astype(jnp.float32), captured["scores"].astype(jnp.float32)


def main(argv):
  del argv
  config = _CONFIG.value
  config.analysis.record_every = 0
  config.analysis.report_at_end = False
  exp = Experiment(config, _WORKDIR.value)
  state = exp.init_state()
  batches = exp.train_batches()
  train_step = exp.jit_train_step()
  probe = mesh_lib.to_global(next(batches), exp.mesh)
  geometry = jax.jit(lambda params: moe_input_geometry(exp, params, probe))
  previous = None
  for step in range(_STEPS.value + 1):
    if step % _EVERY.value == 0:
      g = jax.device_get(geometry(state.params))
      shared = np.asarray(g["shared_score"])
      line = {"step": step, "mean_input_norm": float(g["mean_input_norm"]), "input_norm": float(g["input_norm"]),
              "shared_score_min": float(shared.min()), "shared_score_max": float(shared.max()),
              "token_spread": float(g["token_spread"]), "mean_gate": float(g["mean_gate"])}
      if previous is not None:
        line["shared_score_change_per_step"] = float(np.abs(shared - previous).mean() / _EVERY.value)
      print(json.dumps(line), flush=True)
      previous = shared
    if step < _STEPS.value:
      state, _ = train_step(state, mesh_lib.to_global(next(batches), exp.mesh))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  run_app(main)

"""The facts probe on a tiny run (stablemoe_jax/analysis/facts_probe.py): each fact's recall and routes against a
per-line loop over the trained model (each line's row prefix run alone), the metrics logged at every evaluation
point, the summary's forgetting, and a killed run resumed to the same points."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import facts_cpu
from stablemoe_jax.analysis import facts_probe
from stablemoe_jax.analysis.routes import analysis_model, sown_choices
from stablemoe_jax.data.lm import facts
from stablemoe_jax.experiment import loop
from stablemoe_jax.models.routing import ROUTING


def tiny_facts_config(router: str = "stablemoe"):
  config = facts_cpu.get_config()
  f = config.data.facts
  f.first_names, f.last_names, f.entities, f.attributes, f.attribute_values, f.value_pieces = 5, 4, 20, 2, 8, 8  # 40 lines
  model = config.model
  model.d_model, model.num_heads, model.d_ff, model.max_len = 16, 2, 32, 15
  model.moe.num_experts, model.moe.router = 4, router
  model.moe.distilled_router.dim = 8
  train = config.train
  train.steps, train.stage1_steps, train.warmup_steps, train.learning_rate = 16, 6, 2, 1e-2
  train.batch_size, train.seq_len = 4, 15  # 3 lines a row
  train.log_every, train.eval_every, train.checkpoint_every = 4, 4, 4
  config.eval.batch_size, config.eval.seq_len = 4, 15  # 12 lines a batch: 4 batches, the last padded
  config.health.min_contribution = 0.0
  config.analysis.record_every, config.analysis.report_at_end = 0, False
  return config


def _per_line_reference(exp, params) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(recalled bool [N], training route [N], inference route [N]) of each valid line, the model run on the line's
  own row prefix: eos, the row's lines before it, then its 3 prefix tokens; the last position predicts the value."""
  data, cfg = exp.data, exp.config
  per_row = cfg.eval.seq_len // data.corpus.line_length
  lines = data.corpus.lines
  train_model = analysis_model(exp.task, exp.settings.model)

  @jax.jit  # one compile per prefix length (3)
  def last_position(prefix):
    output, sown = exp.model.apply({"params": params}, prefix, jnp.array(False), deterministic=True,
                                   mutable=[ROUTING])
    _, train_sown = train_model.apply({"params": params}, prefix, jnp.array(False), deterministic=False,
                                      rngs={"dropout": jax.random.key(0)}, mutable=[ROUTING])
    return (jnp.argmax(output.logits()[0, -1]), sown_choices(train_sown)["moe_0"][-1, 0],
            sown_choices(sown)["moe_0"][-1, 0])

  recalled, train_routes, inference_routes = [], [], []
  for i, line in enumerate(lines):
    row_start = (i // per_row) * per_row
    prefix = np.concatenate([[0], lines[row_start:i].ravel(), line[:facts.LINE_PREFIX]])[None, :].astype(np.int32)
    greedy, train_route, inference_route = map(int, last_position(jnp.asarray(prefix)))
    recalled.append(greedy == int(line[facts.LINE_PREFIX]))
    train_routes.append(train_route)
    inference_routes.append(inference_route)
  return np.array(recalled), np.array(train_routes), np.array(inference_routes)


@pytest.mark.slow  # two tiny runs and a per-line loop: ~30 s on 2 cores
def test_probe_against_a_per_line_loop_and_an_exact_resume(tmp_path):
  config = tiny_facts_config()
  summary = loop.train_and_evaluate(config, tmp_path / "run")
  directory = facts_probe.facts_dir(tmp_path / "run")
  assert facts_probe.point_steps(directory) == [4, 8, 12, 16]
  exp = loop.Experiment(config, tmp_path / "run")
  _, state = exp.restore_for_evaluation(16)
  recalled, train_routes, inference_routes = _per_line_reference(exp, state.params)
  last = np.load(directory / "step_0000016.npz")
  assert np.array_equal(last["recalled"], recalled)
  assert np.array_equal(last["inference_routes"][0, :, 0], inference_routes)
  assert np.array_equal(last["train_routes"][0, :, 0], train_routes)  # stage 2: the frozen distilled router
  assert summary.facts["final"]["facts/recall"] == pytest.approx(recalled.mean())
  assert summary.facts["recall_curve"][-1] == pytest.approx(recalled.mean(), abs=1e-5)
  logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [m["step"] for m in logged if "facts/recall" in m] == [4, 8, 12]
  value_balance = [m["facts/moe_0/value_balance"] for m in logged if "facts/recall" in m]
  assert all(0.0 <= v <= 1.0 for v in value_balance)
  counts = summary.facts["forgetting"]
  points = np.stack([np.load(directory / f"step_{s:07d}.npz")["recalled"] for s in (4, 8, 12, 16)])
  assert counts["changed_at_risk"] + counts["kept_at_risk"] == int(points[:-1].sum())

  # killed after step 10 (its last checkpoint: step 8), resumed: the same points, bit for bit
  assert loop.train_and_evaluate(config, tmp_path / "killed", stop_at_step=10) == {"stopped_at_step": 10}
  resumed = loop.train_and_evaluate(config, tmp_path / "killed")
  assert resumed.facts["forgetting"] == counts
  for step in (4, 8, 12, 16):
    a = np.load(directory / f"step_{step:07d}.npz")
    b = np.load(facts_probe.facts_dir(tmp_path / "killed") / f"step_{step:07d}.npz")
    for key in ("recalled", "value_nll", "train_routes", "inference_routes"):
      assert np.array_equal(a[key], b[key]), (step, key)

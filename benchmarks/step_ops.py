"""What the project's dense train step computes beyond a plain JAX GPT-2 step: op counts of both, side by side.

  python -m benchmarks.step_ops --config configs/lm_base.py [--config.x=y ...] [--compiled]

For the dense backbone of a config (``model.moe.enabled=False``, ``main``'s own train step) and for
``benchmarks/reference_gpt2.py`` at the same shapes and dtype, one JSON line each with

* ``jaxpr``: counts from the traced step (any machine, nothing compiled): dtype casts (``convert``, with the
  elements they touch, by source -> target dtype), ``transpose``, ``copy``, random-number ops, every
  ``dot_general`` by operand and result dtypes with its FLOPs (``dot_flops``), and all equations; a scan's
  body counts once per iteration; the float32 bytes its equations write and the largest float32 tensor (its
  elements and shape: the [tokens, vocabulary] logits unless ``model.loss_chunk_tokens`` chunks the loss);
* ``hlo`` (``--compiled``): counts from the program XLA compiled for this machine's device (after fusion and
  layout assignment): ``convert``, ``transpose``, ``copy``, ``dot`` / gemm custom calls by dtype, fusions, and
  XLA's FLOPs; and XLA's memory analysis: ``compiled_memory_bytes`` (arguments + outputs - aliases + temporaries,
  the step's peak on the device as XLA plans it) and ``compiled_temp_bytes``. CPU and GPU compile differently: compare rows of the same device only.

``--cases`` (as in ``benchmarks.throughput``) adds a row per case; the last lines give the differences of every
count: ``dense - reference`` and ``<case> - dense``.
"""
from __future__ import annotations

import contextlib
import json
import sys

import jax
import ml_collections

from benchmarks import reference_gpt2
from benchmarks.cases import DEFAULT_VOCAB_SIZE, DENSE_OVERRIDES, Case, case_config, parse_cases, synthetic_batch
from benchmarks.op_counts import hlo_counts, jaxpr_counts
from benchmarks.throughput import _compiled_bytes
from stablemoe_jax.experiment.config_validation import ConfigError
from stablemoe_jax.experiment.step import jit_train_step
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.tasks.lm import LanguageModelTask
from stablemoe_jax.train.optimizer import make_optimizer
from stablemoe_jax.train.state import create_train_state, train_state_shardings
from stablemoe_jax.core.settings import from_config

def _xla_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])
  except Exception:  # noqa: BLE001 - backends without a cost model
    return None


def project_step(base: ml_collections.ConfigDict, overrides: dict, vocab_size: int = DEFAULT_VOCAB_SIZE):
  """(config, mesh, jitted step, abstract state, batch) of ``main``'s train step for the config + overrides."""
  config = case_config(base, overrides, vocab_size)
  mesh = mesh_lib.make_mesh(config.mesh)
  run = from_config(config)
  model, tx = TransformerLM(run.model), make_optimizer(run.train)
  shardings = train_state_shardings(model, tx, config.train.seq_len, mesh)
  state = jax.eval_shape(lambda: create_train_state(model, tx, config.seed, config.train.seq_len))
  batch = synthetic_batch(0, config.train.batch_size, config.train.seq_len, config.model.vocab_size)
  return config, mesh, jit_train_step(model, tx, run, mesh, shardings, LanguageModelTask()), state, batch


def reference_step(config: ml_collections.ConfigDict):
  """(jitted step, abstract state, batch) of the plain GPT-2 step at ``config``'s shapes (vocabulary filled in)."""
  shape = reference_gpt2.shape_from_config(config)
  model, tx = reference_gpt2.GPT2(shape), reference_gpt2.make_optimizer(config.train)
  state = jax.eval_shape(lambda: reference_gpt2.init_state(model, tx, config.seed))
  batch = synthetic_batch(0, config.train.batch_size, config.train.seq_len, shape.vocab_size)
  return reference_gpt2.jit_train_step(model, tx), state, batch


def step_rows(base: ml_collections.ConfigDict, cases: list[Case] = (), *, compiled: bool = False,
              vocab_size: int = DEFAULT_VOCAB_SIZE) -> list[dict]:
  """Rows of the reference, the dense backbone and each case, then ``dense - reference`` and ``case - dense``."""
  config, mesh, dense, dense_state, dense_batch = project_step(base, DENSE_OVERRIDES, vocab_size)
  reference, ref_state, ref_batch = reference_step(config)
  steps = [("reference", reference, ref_state, ref_batch, None), ("dense", dense, dense_state, dense_batch, mesh)]
  for case in cases:
    _, case_mesh, step, state, batch = project_step(base, case.overrides, vocab_size)
    steps.append((case.name, step, state, batch, case_mesh))
  rows = []
  vocab_sizes = (config.model.vocab_size, -(-config.model.vocab_size // 128) * 128)  # as it is, padded to 128
  for name, step, state, batch, context in steps:
    with jax.set_mesh(context) if context is not None else contextlib.nullcontext():
      traced = step.trace(state, batch)
      row = {"step": name, "device_kind": jax.devices()[0].device_kind, "dtype": config.model.dtype,
             "batch_size": config.train.batch_size, "seq_len": config.train.seq_len,
             "jaxpr": jaxpr_counts(traced.jaxpr, vocab_sizes)}
      if compiled:
        executable = traced.lower().compile()
        row["hlo"] = hlo_counts(executable.as_text())
        row["xla_flops"] = _xla_flops(executable)
        row["compiled_memory_bytes"] = _compiled_bytes(executable)  # arguments + outputs - aliases + temporaries
        row["compiled_temp_bytes"] = _temp_bytes(executable)
    rows.append(row)
  for row, baseline in [(rows[1], rows[0])] + [(row, rows[1]) for row in rows[2:]]:
    rows.append({"step": f"{row['step']} - {baseline['step']}",
                 **{part: _difference(row[part], baseline[part]) for part in ("jaxpr", "hlo") if part in row}})
  return rows


def _temp_bytes(compiled) -> int | None:
  try:
    return int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:  # noqa: BLE001 - backends without a memory analysis
    return None


def _difference(a: dict, b: dict) -> dict:
  """a - b for every count that differs; a value that is not a number (a shape) as ``"a (b)"``."""
  def minus(x, y):
    return x - y if isinstance(x, (int, float)) and isinstance(y, (int, float)) else f"{x} ({y})"
  return {k: minus(a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}


def main() -> None:
  from absl import app, flags
  from ml_collections import config_flags

  config = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.")
  compiled = flags.DEFINE_bool("compiled", False, "Also compile the steps here and count the HLO's ops.")
  cases = flags.DEFINE_string("cases", "", "Cases as in benchmarks.throughput (';'-separated [name:]key=value,...), "
                              "each counted and compared with the dense step.")
  flags.mark_flags_as_required(["config"])

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
      rows = step_rows(config.value, parse_cases(cases.value) if cases.value else [], compiled=compiled.value)
    except (ConfigError, ValueError) as error:  # bad cases or config: one line, exit status 2
      print(f"error: {error}", file=sys.stderr)
      sys.exit(2)
    for row in rows:
      print(json.dumps(row), flush=True)

  app.run(run)


if __name__ == "__main__":
  main()

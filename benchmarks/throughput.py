"""Train-step throughput of a config's model and its dense backbone, side by side, on synthetic tokens.

  python -m benchmarks.throughput --config configs/lm_base.py [--config.x=y ...] [--cases "..."] [--steps 10]

Every case is the config plus a set of overrides, measured with ``main``'s own train step (model,
optimizer, train state, ``donate_argnums=0``, microbatches, mesh) on random token batches, so no data
directory is needed. The dense backbone (``model.moe.enabled=False``) is always measured first, in the
same process; every other row carries ``tokens_per_s_vs_dense``. Before it, unless ``--noreference``, the
``reference`` row: a plain JAX/Flax GPT-2 step of the dense backbone's shapes (``benchmarks/reference_gpt2.py``),
so every run gives ``dense / reference`` (the project's overhead) and ``moe / dense`` on the same device.
One JSON line per case on stdout.

``--cases``: cases separated by ";", each ``[name:]key=value[,key=value...]`` with keys relative to the
config (``model.moe.dispatcher=index,model.moe.capacity_factor=1.0``). A dispatcher is just a case:
``--cases "model.moe.dispatcher=grouped"``. Default: index dispatch at capacity factor 2.0 and 1.0
(and the grouped dispatcher at both, where ``models/dispatch.py`` has one).

Numbers (see ``measure_case``): the median step time over ``--steps`` timed steps after compilation
and ``--warmup`` untimed ones; MFU = analytic train FLOPs per token x tokens/s / the device's peak.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from benchmarks import reference_gpt2
from benchmarks.cases import (DEFAULT_VOCAB_SIZE, DENSE, DENSE_OVERRIDES, REFERENCE, Case, case_config, default_cases,
                              parse_cases, synthetic_batch)
from benchmarks.op_counts import hlo_counts
from benchmarks.trace_summary import profile_steps
from stablemoe_jax.experiment.config_validation import ConfigError, check_backend
from stablemoe_jax.experiment.step import jit_train_step
from stablemoe_jax.models import dispatch as dispatch_lib
from stablemoe_jax.models import flops as flops_lib
from stablemoe_jax.models import routers
from stablemoe_jax.models.transformer import TransformerLM, attention_implementation, has_moe_layers
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.tasks.lm import LanguageModelTask
from stablemoe_jax.train.optimizer import make_optimizer
from stablemoe_jax.train.state import create_train_state, train_state_shardings
from stablemoe_jax.core.settings import from_config


# Dense peak FLOP/s of one device, by a substring of jax's ``device_kind`` (first match wins, so the more
# specific names come first): (bf16 / fp16, float32). float32 is the TF32 tensor-core peak, since XLA's
# default matmul precision runs float32 matmuls as TF32 on these GPUs. Sparse-tensor-core peaks are not used.
PEAK_FLOPS: tuple[tuple[str, float, float | None], ...] = (
    ("H100 PCIe", 756e12, 378e12),
    ("H100 NVL", 835e12, 418e12),
    ("GH200", 989e12, 494e12),
    ("H200", 989e12, 494e12),
    ("H100", 989e12, 494e12),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H800", 989e12, 494e12),
    ("A100", 312e12, 156e12),
    ("L40S", 362e12, 183e12),
    ("L4", 121e12, 60e12),
    ("TPU v6", 918e12, None),
    ("TPU v5p", 459e12, None),
    ("TPU v5", 197e12, None),  # v5e: "TPU v5 lite"
    ("TPU v4", 275e12, None),
)

REQUIRED_KEYS = ("case", "device_kind", "jax_version", "dtype", "dispatcher", "capacity_factor", "step_time_s",
                 "tokens_per_s", "mfu", "peak_memory_bytes", "peak_memory_source")


def peak_flops_per_s(device_kind: str, dtype: str) -> float | None:
  """The device's dense peak for ``dtype`` (bf16/fp16 or float32) from ``PEAK_FLOPS``; None if unknown."""
  for name, half, single in PEAK_FLOPS:
    if name.lower() in device_kind.lower():
      return single if dtype == "float32" else half
  return None


def train_flops_per_token(params: Any, seq_len: int, capacity_factor: float = 1.0) -> int:
  """Analytic train FLOPs per token: 3 x ``flops.forward_flops_per_token`` (forward + backward, 2x forward).

  Experts at ``capacity_factor`` (1: the useful work of top-1 routing). Causal attention is counted over
  the whole S x S square (4 S d per layer forward), as the XLA implementation computes it and as MFU is
  usually reported (PaLM's 6N + 12 L H Q T); cuDNN's causal kernel skips the masked half.
  """
  return 3 * flops_lib.forward_flops_per_token(params, seq_len, capacity_factor)


def _memory_stats() -> dict | None:
  try:
    return jax.local_devices()[0].memory_stats()
  except Exception:  # noqa: BLE001 - backends without memory stats raise various errors
    return None


def _cost_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001
    return None
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"]) if cost and "flops" in cost else None


def _compiled_bytes(compiled) -> int | None:
  try:
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)
  except Exception:  # noqa: BLE001
    return None


def _hlo_ops(compiled) -> dict | None:
  try:
    return hlo_counts(compiled.as_text())
  except Exception:  # noqa: BLE001 - an executable without HLO text
    return None


def _dispatcher_name(name: str, mesh) -> str:
  """``model.moe.dispatcher`` with "auto" resolved to the dispatcher the layer picks on ``mesh``."""
  with jax.set_mesh(mesh):
    chosen = dispatch_lib.choose_dispatcher(name)
  return next((k for k, v in dispatch_lib.DISPATCHERS.items() if v is chosen), name)


@dataclasses.dataclass
class Prepared:
  """A case ready to run: its config, mesh, train state, compiled step and device batches."""

  case: Case
  config: ml_collections.ConfigDict
  mesh: Any
  state: Any
  compiled: Any
  batches: list
  compile_s: float
  train_flops_per_token: int | None = None  # None: analytic, from the project model's parameter tree


def prepare_case(base: ml_collections.ConfigDict, case: Case, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 num_batches: int = 2) -> Prepared:
  """Builds the case's model, optimizer and state as ``main`` does, and compiles its train step."""
  config = case_config(base, case.overrides, vocab_size)
  check_backend(config, jax.default_backend())
  mesh_lib.check_layout(config, jax.device_count())
  mesh = mesh_lib.make_mesh(config.mesh)
  run = from_config(config)
  model = TransformerLM(run.model)
  tx = make_optimizer(run.train)
  train = config.train
  shardings = train_state_shardings(model, tx, train.seq_len, mesh)
  state = create_train_state(model, tx, config.seed, train.seq_len, mesh, shardings=shardings)
  uniform = lambda: np.ones(config.model.vocab_size, np.int64)  # a balanced hash table needs token counts
  params = routers.fill_tables_from_data(state.params, run.model, uniform)
  if params is not state.params:
    state = state.replace(params=jax.device_put(params, shardings.params))
  batches = [mesh_lib.to_global(mesh_lib.local_rows(synthetic_batch(config.seed + i, train.batch_size, train.seq_len,
                                                                    config.model.vocab_size)), mesh)
             for i in range(num_batches)]
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    step = jit_train_step(model, tx, run, mesh, shardings, LanguageModelTask())
    compiled = step.lower(state, batches[0]).compile()
  return Prepared(case, config, mesh, state, compiled, batches, time.perf_counter() - start)


def prepare_reference(base: ml_collections.ConfigDict, vocab_size: int = DEFAULT_VOCAB_SIZE,
                      num_batches: int = 2) -> Prepared:
  """The plain JAX/Flax GPT-2 step (``benchmarks/reference_gpt2.py``) at the dense backbone's shapes, compiled."""
  config = case_config(base, DENSE_OVERRIDES, vocab_size)
  shape = reference_gpt2.shape_from_config(config)
  model, tx = reference_gpt2.GPT2(shape), reference_gpt2.make_optimizer(config.train)
  state = reference_gpt2.init_state(model, tx, config.seed)
  train = config.train
  batches = [jax.device_put(synthetic_batch(config.seed + i, train.batch_size, train.seq_len, shape.vocab_size))
             for i in range(num_batches)]
  start = time.perf_counter()
  compiled = reference_gpt2.jit_train_step(model, tx).lower(state, batches[0]).compile()
  return Prepared(Case(REFERENCE, {}), config, None, state, compiled, batches, time.perf_counter() - start,
                  reference_gpt2.train_flops_per_token(shape, train.seq_len))


def measure_case(prepared: Prepared, steps: int = 10, warmup: int = 2, profile_dir: str | None = None) -> dict:
  """Runs ``warmup`` + ``steps`` train steps of a prepared case and returns its JSON row.

  Each step is timed to its state being ready (``block_until_ready``); the row's ``step_time_s`` is the
  median of the timed ones. ``peak_memory_bytes``: the device's ``peak_bytes_in_use`` if it reports one
  (a process-wide high-water mark: ``peak_memory_upper_bound`` is true when this case did not raise it,
  so its own peak is at most that), else the compiled step's ``memory_analysis`` (arguments + outputs
  - donated aliases + temporaries). ``profile_dir``: three more steps run under the profiler, and the row's
  ``profile`` gives the device time per step by op (``benchmarks/trace_summary.py``).
  """
  config, compiled = prepared.config, prepared.compiled
  run = from_config(config)
  model_cfg, moe, train = run.model, run.model.moe, run.train
  device = jax.devices()[0]
  before = _memory_stats() or {}
  state, times, losses = prepared.state, [], []
  prepared.state = None  # donated below: the prepared state must not be used again
  initial_params = jax.tree.leaves(state.params)
  for i in range(warmup + steps):
    start = time.perf_counter()
    state, metrics = compiled(state, prepared.batches[i % len(prepared.batches)])
    jax.block_until_ready(state)
    if i == 0:
      donated = all(leaf.is_deleted() for leaf in initial_params)  # the step wrote the new state in place
      del initial_params
    if i >= warmup:
      times.append(time.perf_counter() - start)
    losses.append((float(metrics["loss"]), float(metrics["task_loss"])))
  after = _memory_stats() or {}
  profile = None
  if profile_dir:
    state, profile = profile_steps(compiled, state, prepared.batches[0], 3, f"{profile_dir}/{prepared.case.name}")

  tokens_per_step = train.batch_size * train.seq_len
  step_time = statistics.median(times)
  routed = has_moe_layers(model_cfg)
  capacity_factor = moe.capacity_factor if routed else None
  analytic = prepared.train_flops_per_token or train_flops_per_token(state.params, train.seq_len)
  peak = peak_flops_per_s(device.device_kind, model_cfg.dtype)
  xla_flops = _cost_flops(compiled)
  counts = flops_lib.param_counts(state.params)
  compiled_bytes = _compiled_bytes(compiled)
  if "peak_bytes_in_use" in after:
    peak_memory, source = int(after["peak_bytes_in_use"]), "memory_stats.peak_bytes_in_use"
    upper_bound = after["peak_bytes_in_use"] <= before.get("peak_bytes_in_use", 0)
  else:
    peak_memory, source, upper_bound = compiled_bytes, "memory_analysis.arguments+outputs-aliases+temp", False
  return {
      "case": prepared.case.name,
      "overrides": prepared.case.overrides,
      "device_kind": device.device_kind,
      "device_count": jax.device_count(),
      "backend": jax.default_backend(),
      "jax_version": jax.__version__,
      "dtype": model_cfg.dtype,
      "attention": (reference_gpt2.shape_from_config(config).attention if prepared.case.name == REFERENCE
                    else attention_implementation(model_cfg)),
      "remat": model_cfg.remat,
      "moe": routed,
      "router": moe.router if routed else None,
      "dispatcher": _dispatcher_name(moe.dispatcher, prepared.mesh) if routed else None,
      "capacity_factor": capacity_factor,
      "num_groups": moe.num_groups if routed else None,
      "batch_size": train.batch_size,
      "microbatches": train.microbatches,
      "seq_len": train.seq_len,
      "vocab_size": model_cfg.vocab_size,
      "tokens_per_step": tokens_per_step,
      "params": counts["total"],
      "expert_params": counts["expert"],
      "compile_s": round(prepared.compile_s, 3),
      "steps_timed": len(times),
      "step_time_s": step_time,
      "step_time_min_s": min(times),
      "tokens_per_s": tokens_per_step / step_time,
      # analytic, experts at capacity factor 1 (useful work) and at the case's capacity factor (computed)
      "train_flops_per_token": analytic,
      "train_flops_per_token_at_cf": (train_flops_per_token(state.params, train.seq_len, capacity_factor)
                                      if routed else analytic),
      # XLA's count of the compiled step; a scan over microbatches > 1 is counted once, so only for 1
      "xla_flops_per_token": xla_flops / tokens_per_step if xla_flops and train.microbatches == 1 else None,
      "peak_flops_per_s": peak,
      "mfu": analytic * tokens_per_step / step_time / peak if peak else None,
      "peak_memory_bytes": peak_memory,
      "peak_memory_source": source,
      "peak_memory_upper_bound": upper_bound,
      "compiled_memory_bytes": compiled_bytes,
      "state_donated": donated,
      # the compiled step's instructions on this device (converts, transposes, copies, GEMMs by dtype, fusions)
      "hlo_ops": _hlo_ops(compiled),
      "profile": profile,
      # the LM cross-entropy, and the total with the routers' auxiliary losses; random tokens: ~log V
      "task_loss_first": losses[0][1],
      "task_loss_last": losses[-1][1],
      "loss_first": losses[0][0],
      "loss_last": losses[-1][0],
  }


def run_cases(base: ml_collections.ConfigDict, cases: list[Case], *, steps: int = 10, warmup: int = 2,
              vocab_size: int = DEFAULT_VOCAB_SIZE, emit=None, reference: bool = True,
              profile_dir: str | None = None, dense: bool = True) -> list[dict]:
  """Measures the plain-JAX reference (if ``reference``), the dense backbone, then every case.

  Every row after the first carries its tokens/s and step time relative to the rows measured before it
  (``tokens_per_s_vs_reference``, ``tokens_per_s_vs_dense``). A case that fails (e.g. out of memory) gets an
  error row. ``emit(row)`` is called as each row is ready (the CLI prints it), so a later failure loses nothing.
  """
  rows, baselines = [], {}
  first = [Case(REFERENCE, {})] if reference else []
  for case in [*first, *([Case(DENSE, DENSE_OVERRIDES)] if dense else []), *cases]:
    try:
      prepared = (prepare_reference(base, vocab_size) if case.name == REFERENCE
                  else prepare_case(base, case, vocab_size))
      row = measure_case(prepared, steps, warmup, profile_dir)
    except ConfigError:
      raise
    except Exception as error:  # noqa: BLE001 - one case's failure (OOM, unsupported kernel) must not end the run
      row = {"case": case.name, "overrides": case.overrides, "device_kind": jax.devices()[0].device_kind,
             "jax_version": jax.__version__, "error": f"{type(error).__name__}: {str(error)[:2000]}"}
    if "error" not in row:
      for name, baseline in baselines.items():
        row[f"tokens_per_s_vs_{name}"] = row["tokens_per_s"] / baseline["tokens_per_s"]
        row[f"step_time_vs_{name}"] = row["step_time_s"] / baseline["step_time_s"]
      if case.name in (REFERENCE, DENSE):
        baselines[case.name] = row
    rows.append(row)
    if emit:
      emit(row)
    prepared = None
    gc.collect()  # frees the last case's state and executable before the next one allocates
  return rows


def main() -> None:
  from absl import app, flags
  from ml_collections import config_flags

  config = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.")
  cases = flags.DEFINE_string("cases", "", "Cases separated by ';', each [name:]key=value[,key=value]; "
                              "default: index (and grouped, if present) at capacity factor 2.0 and 1.0.")
  steps = flags.DEFINE_integer("steps", 10, "Timed steps per case (after compilation and --warmup).")
  warmup = flags.DEFINE_integer("warmup", 2, "Untimed steps per case after compilation.")
  vocab = flags.DEFINE_integer("vocab_size", DEFAULT_VOCAB_SIZE, "Vocabulary when model.vocab_size is 0.")
  reference = flags.DEFINE_bool("reference", True, "Measure the plain JAX/Flax GPT-2 step "
                                "(benchmarks/reference_gpt2.py) first, at the dense backbone's shapes.")
  dense = flags.DEFINE_bool("dense", True, "Measure the dense backbone (--nodense: the cases alone, e.g. one case a "
                            "process under benchmarks.peak_memory).")
  profile = flags.DEFINE_string("profile_dir", "", "If set, profile 3 more steps of each case there and add "
                                "the device time per op to its row (benchmarks/trace_summary.py).")
  flags.mark_flags_as_required(["config"])

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if steps.value < 1 or warmup.value < 0 or vocab.value < 1:
      raise app.UsageError("--steps and --vocab_size must be >= 1, --warmup >= 0")
    try:
      chosen = parse_cases(cases.value) if cases.value else default_cases()
      first = [REFERENCE] if reference.value else []
      names = first + [DENSE] * dense.value + [c.name for c in chosen]
      print(f"devices: {jax.devices()}; cases: {names}", file=sys.stderr,
            flush=True)
      run_cases(config.value, chosen, steps=steps.value, warmup=warmup.value, vocab_size=vocab.value,
                emit=lambda row: print(json.dumps(row), flush=True), reference=reference.value,
                profile_dir=profile.value or None, dense=dense.value)
    except (ConfigError, ValueError) as error:  # bad cases or config: one line, exit status 2
      print(f"error: {error}", file=sys.stderr)
      sys.exit(2)

  app.run(run)


if __name__ == "__main__":
  main()

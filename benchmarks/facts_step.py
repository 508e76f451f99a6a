"""Where the facts regime's step goes (configs/facts_cpu.py's tiny model), against a plain ``jnp.dot``, in one process.

  python -m benchmarks.facts_step --workdir /tmp/facts_step [--cases "name:key=value,...;..."] [--rounds 5]
      [--steps 20] [--scan 1,4,16] [--out benchmarks/results/facts_step/cpu.jsonl]

Every case is configs/facts_cpu.py plus its overrides, built by ``main``'s own ``Experiment`` (model, optimizer,
train state, jitted train step, the facts iterator); the dense backbone (``model.moe.enabled=False``) is always the
first case. One JSON line each:

* ``matmul``: a plain ``jnp.dot`` of the model's FFN shapes ([B*S, d] x [d, d_ff], then [B*S, d_ff] x [d_ff, d]),
  jitted, fastest of 20 calls: the FLOP/s this machine gives a matmul of these sizes.
* ``case`` rows, interleaved in rounds (median over rounds, the rounds share the machine's load): seconds a train
  step, XLA's FLOP count of the step (``cost_analysis``), achieved GFLOP/s and its ratio to the matmul's, and
  ``scan_K``: seconds a step when K steps run in one compiled call (``jax.lax.scan`` over K batches; the same
  updates, checked: the parameters after K scanned steps equal K single steps to float32 rounding). A ratio near 1
  is bound by the matmuls; far below, by per-op overhead that larger fused programs (scan_K) or larger batches cut.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.cases import DENSE, DENSE_OVERRIDES, apply_overrides, parse_cases
from benchmarks.json_lines import JsonLines
from configs import facts_cpu
from stablemoe_jax.experiment.loop import Experiment
from stablemoe_jax.experiment.step import make_train_step
from stablemoe_jax.parallel import mesh as mesh_lib

DEFAULT_CASES = "stablemoe_index:model.moe.dispatcher=index;stablemoe_one_hot:model.moe.dispatcher=one_hot"


def _fastest(fn, calls: int) -> float:
  best = float("inf")
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def matmul_gflops(tokens: int, d: int, width: int) -> float:
  """GFLOP/s of a jitted [tokens, d] x [d, width] then [tokens, width] x [width, d] (an FFN without its
  nonlinearity), fastest of 20 calls."""
  x = jnp.ones((tokens, d), jnp.float32)
  w_in, w_out = jnp.ones((d, width), jnp.float32) * 0.01, jnp.ones((width, d), jnp.float32) * 0.01
  ffn = jax.jit(lambda x, a, b: jnp.dot(jnp.dot(x, a), b))
  jax.block_until_ready(ffn(x, w_in, w_out))
  return 4 * tokens * d * width / _fastest(lambda: ffn(x, w_in, w_out), 20) / 1e9


class StepCase:
  """One case's experiment, its single-step program and its K-step scanned programs."""

  def __init__(self, name: str, config, workdir: pathlib.Path, scans: list[int]):
    self.name = name
    self.exp = Experiment(config, workdir / name)
    self.state = self.exp.init_state()
    batches = self.exp.train_batches()
    self.batches = [mesh_lib.to_global(next(batches), self.exp.mesh) for _ in range(max(scans + [1]))]
    self.step = self.exp.jit_train_step()
    raw_step = make_train_step(self.exp.model, self.exp.tx, self.exp.settings, self.exp.task)

    def scanned(state, stacked):
      return jax.lax.scan(lambda s, b: raw_step(s, b), state, stacked)

    self.scanned = {k: jax.jit(scanned) for k in scans if k > 1}
    self.stacked = {k: jax.tree.map(lambda *xs: jnp.stack(xs), *self.batches[:k]) for k in self.scanned}
    lowered = jax.jit(raw_step).lower(self.state, self.batches[0])
    self.flops = float((lowered.compile().cost_analysis() or {}).get("flops", 0.0))

  def warm(self) -> None:
    for batch in self.batches[:2]:
      self.state, _ = self.step(self.state, batch)
    for k, fn in self.scanned.items():
      self.state, _ = fn(self.state, self.stacked[k])
    jax.block_until_ready(self.state)

  def time_steps(self, steps: int) -> float:
    start = time.perf_counter()
    for i in range(steps):
      self.state, metrics = self.step(self.state, self.batches[i % len(self.batches)])
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / steps

  def time_scan(self, k: int, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
      self.state, metrics = self.scanned[k](self.state, self.stacked[k])
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / (calls * k)


def scan_matches_steps(case: StepCase, k: int) -> float:
  """The largest |difference| of any parameter after K scanned steps and after K single steps from one state."""
  start = jax.device_get(case.state)
  single = jax.device_put(start)
  for batch in case.batches[:k]:
    single, _ = case.step(single, batch)
  scanned, _ = case.scanned[k](jax.device_put(start), case.stacked[k])
  diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), single.params, scanned.params)
  return max(jax.tree.leaves(diffs))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, type=pathlib.Path)
  parser.add_argument("--cases", default=DEFAULT_CASES)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--scan", default="1,4,16", help="steps per compiled call to time (1: the loop's)")
  parser.add_argument("--out", type=pathlib.Path, default=None)
  args = parser.parse_args()
  out = JsonLines(args.out)
  base = facts_cpu.get_config()
  scans = sorted({int(k) for k in args.scan.split(",")})
  tokens = base.train.batch_size * base.train.seq_len
  matmul = matmul_gflops(tokens, base.model.d_model, base.model.d_ff)
  out.add({"kind": "matmul", "tokens": tokens, "d": base.model.d_model, "width": base.model.d_ff,
           "gflops_per_s": round(matmul, 2), "device": jax.devices()[0].device_kind})
  cases = [(DENSE, DENSE_OVERRIDES)] + [(c.name, c.overrides) for c in parse_cases(args.cases)]
  built = [StepCase(name, apply_overrides(base, overrides), args.workdir, scans) for name, overrides in cases]
  for case in built:
    case.warm()
  rows: dict[str, dict[str, list[float]]] = {c.name: {} for c in built}
  for _ in range(args.rounds):
    for case in built:
      rows[case.name].setdefault("scan_1", []).append(case.time_steps(args.steps))
      for k in case.scanned:
        rows[case.name].setdefault(f"scan_{k}", []).append(case.time_scan(k, max(1, args.steps // k)))
  dense_seconds = statistics.median(rows[DENSE]["scan_1"])
  for case in built:
    seconds = {key: statistics.median(values) for key, values in rows[case.name].items()}
    step = seconds["scan_1"]
    achieved = case.flops / step / 1e9
    out.add({"kind": "case", "case": case.name, "overrides": dict(cases)[case.name], "step_seconds": round(step, 5),
             "step_gflop": round(case.flops / 1e9, 4), "gflops_per_s": round(achieved, 2),
             "ratio_to_matmul": round(achieved / matmul, 3), "step_vs_dense": round(step / dense_seconds, 3),
             **{f"{key}_seconds": round(value, 5) for key, value in seconds.items() if key != "scan_1"},
             **{f"{key}_speedup": round(step / value, 3) for key, value in seconds.items() if key != "scan_1"},
             **{f"scan_{k}_max_param_diff": scan_matches_steps(case, k) for k in case.scanned}})
  out.save()


if __name__ == "__main__":
  main()

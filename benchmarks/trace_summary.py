"""Where a step's device time goes: a ``jax.profiler`` trace of a few steps, summed per op.

``profile_steps(step, state, batch, steps, directory)`` runs ``steps`` calls of a compiled step under
``jax.profiler.trace(..., create_perfetto_trace=True)`` and reads the Perfetto JSON it writes (no
TensorBoard or protobuf needed): for each thread of each device process (on a GPU: the "XLA Ops" line, the
kernel streams), the busy time per step and the ops that take the most of it, per step.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os

import jax


def summarize_trace(path: str, steps: int, top: int = 25) -> dict:
  """{process: {thread: {"busy_us_per_step", "events_per_step", "top": [[name, us_per_step, calls_per_step]]}}}.

  Host threads (process names starting with "/host") are left out: only device time is summed.
  """
  with gzip.open(path, "rt") as handle:
    trace = json.load(handle)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  process_names, thread_names = {}, {}
  for event in events:
    if event.get("ph") == "M" and event.get("name") == "process_name":
      process_names[event["pid"]] = event["args"]["name"]
    elif event.get("ph") == "M" and event.get("name") == "thread_name":
      thread_names[(event["pid"], event["tid"])] = event["args"]["name"]
  durations = collections.defaultdict(lambda: collections.defaultdict(float))
  calls = collections.defaultdict(collections.Counter)
  for event in events:
    if event.get("ph") != "X" or "dur" not in event:
      continue
    process = process_names.get(event["pid"], str(event["pid"]))
    if process.startswith("/host"):
      continue
    key = (process, thread_names.get((event["pid"], event.get("tid")), str(event.get("tid"))))
    durations[key][event["name"]] += float(event["dur"])
    calls[key][event["name"]] += 1
  summary: dict = {}
  for (process, thread), by_name in durations.items():
    ranked = sorted(by_name.items(), key=lambda item: -item[1])[:top]
    summary.setdefault(process, {})[thread] = {
        "busy_us_per_step": round(sum(by_name.values()) / steps, 1),
        "events_per_step": round(sum(calls[(process, thread)].values()) / steps, 1),
        "top": [[name, round(us / steps, 1), round(calls[(process, thread)][name] / steps, 2)] for name, us in ranked],
    }
  return summary


def profile_steps(step, state, batch, steps: int, directory: str):
  """Runs ``steps`` calls of ``step(state, batch) -> (state, metrics)`` under the profiler; (state, summary)."""
  os.makedirs(directory, exist_ok=True)
  with jax.profiler.trace(directory, create_perfetto_trace=True):
    for _ in range(steps):
      state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
  paths = sorted(glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True),
                 key=os.path.getmtime)
  return state, (summarize_trace(paths[-1], steps) if paths else {})

"""Decoding speed of a translation model: greedy and beam search sentences/s, and the cost of one decode step.

  python benchmarks/decode_speed.py --workdir RUN_WORKDIR [--sentences N]            # the run's latest checkpoint
  python benchmarks/decode_speed.py --workdir RUN_WORKDIR --random_init --config configs/mt_cpu.py

The run's prepared data gives the tokenizer and the sentences: the first ``--sentences`` sources of
``--pair``'s ``--set`` (default de-en ``test_2016_flickr``, 1,000 sentences). ``--random_init`` decodes with
freshly initialised parameters of ``--config`` (its data settings must match the workdir's prepared data)
and restores nothing.

Sentences/s: ``translate_lines`` (the path of BLEU evaluation and ``--mode=translate``: sorted by length,
``decode.batch_size`` sentences a batch, detokenised) with the decode config's beam size replaced by 1
(greedy) and by each of ``--beams``. Each batch shape is compiled ahead of its first call
(``jit(...).lower(...).compile()``) and that time is reported apart (``compile_s``); ``decode_s`` is the rest,
``decode_cpu_s`` the process's CPU time in it (all threads; on a shared machine it varies less with the
other jobs' load than the wall time).
A random-initialised model almost never emits eos, so each batch then runs to ``decode.max_len`` steps (the
most any batch can take); ``mean_steps`` (the longest best hypothesis of each batch, averaged) says how many
steps ran.

Step cost: one jitted decode step of the model (``decode.batch_size`` x the largest beam rows, the cache
donated as in the search loop) timed at positions 1 and ``max_len - 1`` (median of ``--repeats``), and its
compiled FLOPs (``cost_analysis()``; the position is a traced value, so one compile serves every position:
the self-attention reads all ``max_len`` cached positions, masked), for each way the step reads the
encoder output: ``cross_kv_reprojected`` (the cross-attention keys and values projected from the encoder
output inside each step) and, where the model has ``cross_keys_values``, ``cross_kv_cached`` (projected
once before the loop). The script also runs on the code before that method
existed (it then measures the first variant only), which is how the before/after numbers of
``benchmarks/results/decode_speed/`` were taken.

One JSON object on stdout and in ``--out`` (if given).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # runnable as a file from the repo root

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from stablemoe_jax.core.settings import from_config  # noqa: E402
from stablemoe_jax.data.translation.pipeline import load_translation_data  # noqa: E402
from stablemoe_jax.decoding.translate_lines import encode_sources, translate_lines  # noqa: E402
from stablemoe_jax.decoding.translator import decoding_model_config, make_translate_fn  # noqa: E402
from stablemoe_jax.models.seq2seq import CACHE, PAD_ID, TransformerSeq2Seq  # noqa: E402
from stablemoe_jax.core.settings import ModelSettings, typed


def load_config(path: str) -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def model_and_data(args):
  """(config, params, data, checkpoint step or None)."""
  workdir = pathlib.Path(args.workdir)
  if args.random_init:
    config = load_config(args.config)
    data = load_translation_data(from_config(config).data, workdir / "data")
    config.model.vocab_size = data.vocab_size
    sample = jnp.zeros((1, config.model.max_len), jnp.int32)
    params = TransformerSeq2Seq(typed(ModelSettings, config.model)).init(jax.random.key(args.seed), sample, sample, jnp.array(True))
    return config, params["params"], data, None
  from stablemoe_jax.experiment import loop
  config = load_config(args.config) if args.config else ml_collections.ConfigDict(
      json.loads((workdir / "config.json").read_text()))
  exp = loop.Experiment(config, workdir)
  try:
    step, state = exp.restore_for_evaluation(None)
  finally:
    exp.checkpointer.close()
  return exp.config, state.params, exp.data, step


class CompiledAhead:
  """Wraps a jitted ``translate_fn``: compiles each new batch shape ahead of its call, timing it apart."""

  def __init__(self, translate_fn):
    self.translate_fn, self.compiled, self.steps = translate_fn, {}, []
    self.compile_s = self.compile_cpu_s = 0.0

  def __call__(self, params, batch):
    if batch.shape not in self.compiled:
      start, cpu_start = time.perf_counter(), time.process_time()
      self.compiled[batch.shape] = self.translate_fn.lower(params, batch).compile()
      self.compile_s += time.perf_counter() - start
      self.compile_cpu_s += time.process_time() - cpu_start
    tokens, scores = self.compiled[batch.shape](params, batch)
    self.steps.append(int(np.max(np.sum(np.asarray(tokens) != PAD_ID, axis=1))))
    return tokens, scores


def sentences_per_second(config, params, data, lines, language, beam_size: int) -> dict:
  dec = config.decode
  max_len = dec.max_len or config.model.max_len
  fn = CompiledAhead(make_translate_fn(typed(ModelSettings, config.model), beam_size, max_len, dec.length_penalty))
  cpu_start = time.process_time()
  out = translate_lines(fn, params, data.tokenizer, language, lines, dec.batch_size, config.eval.seq_len)
  decode_s, cpu_s = out.seconds - fn.compile_s, time.process_time() - cpu_start - fn.compile_cpu_s
  return {"beam_size": beam_size, "sentences": len(lines), "sentences_per_s": round(len(lines) / decode_s, 2),
          "decode_s": round(decode_s, 2), "decode_cpu_s": round(cpu_s, 2),
          "sentences_per_cpu_s": round(len(lines) / cpu_s, 2), "compile_s": round(fn.compile_s, 2),
          "batch_shapes": sorted(str(s) for s in fn.compiled), "mean_steps": round(float(np.mean(fn.steps)), 1)}


def step_costs(config, params, data, lines, language, beam_size: int, repeats: int) -> dict:
  """Time and FLOPs of one decode step at positions 1 and max_len - 1, per way of reading the encoder output."""
  model = TransformerSeq2Seq(decoding_model_config(typed(ModelSettings, config.model)))
  batch, max_len = config.decode.batch_size, config.decode.max_len or config.model.max_len
  sources, _ = encode_sources(data.tokenizer, language, lines[:batch], config.eval.seq_len)
  width = max(len(s) for s in sources)
  source = np.full((batch, width), PAD_ID, np.int32)  # the first sentences, padded to their own length
  for row, s in enumerate(sources):
    source[row, :len(s)] = s
  source = jnp.repeat(jnp.asarray(source), beam_size, axis=0)
  rows, stage2 = batch * beam_size, jnp.array(False)
  encoded = model.apply({"params": params}, source, stage2, method=model.encode)
  cache = jax.tree.map(jnp.zeros_like, model.init(jax.random.key(0), source, jnp.zeros((rows, max_len), jnp.int32),
                                                  stage2, decode=True)[CACHE])
  variants = {"cross_kv_reprojected": encoded}
  if hasattr(model, "cross_keys_values"):
    variants["cross_kv_cached"] = model.apply({"params": params}, encoded, method=model.cross_keys_values)

  def step(params, memory, tokens, cache, position):
    head, variables = model.apply({"params": params, CACHE: cache}, memory, source, tokens[:, None], stage2,
                                  decode=True, position=position, method=model.decode, mutable=[CACHE])
    return jax.nn.log_softmax(head.logits()[:, 0]), variables[CACHE]

  tokens = jnp.full((rows,), 5, jnp.int32)
  results = {"rows": rows, "source_len": width, "max_len": max_len}
  for name, memory in variants.items():
    # The cache is donated and each call's cache fed to the next, as in the search's while_loop (updated in place).
    compiled = jax.jit(step, donate_argnums=3).lower(params, memory, tokens, cache, jnp.array(0, jnp.int32)).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    entry = {"gflops": round(cost.get("flops", float("nan")) / 1e9, 3)}
    for position in (1, max_len - 1):
      position_array = jnp.array(position, jnp.int32)
      times = []
      for _ in range(repeats + 1):  # the first call is not timed
        start = time.perf_counter()
        _, cache = jax.block_until_ready(compiled(params, memory, tokens, cache, position_array))
        times.append(time.perf_counter() - start)
      entry[f"ms_at_position_{position}"] = round(1e3 * statistics.median(times[1:]), 2)
    results[name] = entry
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="a translation run's workdir (its data/, checkpoints/)")
  parser.add_argument("--config", default="", help="configs/*.py (default: the workdir's config.json)")
  parser.add_argument("--random_init", action="store_true", help="random parameters of --config; no checkpoint")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--pair", default="de-en")
  parser.add_argument("--set", default="test_2016_flickr")
  parser.add_argument("--sentences", type=int, default=1000)
  parser.add_argument("--beams", default="5", help="beam sizes besides greedy, comma-separated")
  parser.add_argument("--repeats", type=int, default=5, help="timed runs of a single step")
  parser.add_argument("--skip_steps", action="store_true", help="no single-step measurement")
  parser.add_argument("--skip_speed", action="store_true", help="no sentences/s measurement")
  parser.add_argument("--out", default="", help="also write the JSON here")
  args = parser.parse_args()
  if args.random_init and not args.config:
    parser.error("--random_init needs --config")

  config, params, data, step = model_and_data(args)
  lines, _ = data.raw_text(args.pair, args.set)
  lines = lines[:args.sentences]
  language = args.pair.split("-")[0]
  beams = [1] + [int(b) for b in args.beams.split(",") if b]
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).parent).stdout.strip() or "not a git checkout"
  result = {"command": " ".join(sys.argv), "commit": commit, "checkpoint_step": step,
            "random_init": args.random_init, "device": jax.devices()[0].device_kind, "cpus": jax.device_count(),
            "host": platform.node(), "set": f"{args.pair}/{args.set}",
            "decode": {"batch_size": config.decode.batch_size, "max_len": config.decode.max_len or config.model.max_len,
                       "length_penalty": config.decode.length_penalty},
            "speed": [] if args.skip_speed else [sentences_per_second(config, params, data, lines, language, k)
                                                  for k in beams]}
  if not args.skip_steps:
    result["step"] = step_costs(config, params, data, lines, language, max(beams), args.repeats)
  text = json.dumps(result, indent=2)
  print(text)
  if args.out:
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
  main()

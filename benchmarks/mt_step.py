"""Where a translation step's time goes, and real target tokens a second for each way of batching, in one process.

  STABLEMOE_DATA_DIR=../shared/data python -m benchmarks.mt_step --workdir /work/runs/mt_step \
    [--config configs/compare_mt_cpu.py] [--cases "name:key=value,...;..."] [--rounds 4] [--steps 6] \
    [--out benchmarks/results/mt_step/cpu.jsonl]

Every case is ``--config`` plus its overrides, built by ``main``'s own ``Experiment`` (model, optimizer, train
state, jitted train step, the task's training iterator over real pairs; the workdir's ``data/`` is prepared once
and shared). One JSON line each:

* ``parts`` (the first case's model and its dense backbone, on one [B, L] batch of real pairs): seconds of
  forward + backward of the encoder, of the decoder without the head, of the tied head and its label-smoothed
  loss, and of the optimizer update, each jitted alone (fastest of 5 calls), beside the whole train step, and
  XLA's FLOP count of each (``*_gflop``: steady where the seconds are not). MoE minus dense on the encoder and the
  decoder is what the MoE layers cost.
* ``per_run`` (each case): what evaluation adds over a run of the config's ``train.steps``: the periodic
  evaluations (``train.eval_batches`` a point, again without each MoE layer), the routing records, the final
  NLL and contribution checks (each case's batches counted, one batch of its kind timed, the cases interleaved),
  and the final BLEU (beam search timed on ``--decode_sentences`` sentences of de-en ``test_2016_flickr``, times
  the sentences the case decodes: every test set, or each pair's primary one). A model a few steps from random
  initialisation never stops early, so its decoding time is an upper bound.
* ``whole_run`` (each case): real target tokens a second of the whole run, evaluation included: ``train.steps``
  steps at the case's median step time and real target tokens, plus its ``per_run`` seconds; and the ratio to
  the first case.
* ``case`` rows: the cases' train steps interleaved, ``--steps`` a case a round, ``--rounds`` rounds after a
  warm-up that compiles every batch shape; real target tokens a second (scored positions, eos included), real
  source tokens a second, the share of positions that are real, and the ratio to the first case in each round
  (median over rounds: the rounds share the machine's load).
* ``loss_check`` (each packed case): one of its batches' pairs scored packed and one pair a row, same parameters,
  no dropout: the label-smoothed mean loss and the summed NLL, with their differences.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.cases import apply_overrides, parse_cases
from benchmarks.json_lines import JsonLines
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.decoding import bleu_report
from stablemoe_jax.decoding.translate_lines import translate_lines
from stablemoe_jax.decoding.translator import make_translate_fn
from stablemoe_jax.experiment.loop import Experiment
from stablemoe_jax.experiment.step import step_rngs
from stablemoe_jax.models.head import HeadInputs
from stablemoe_jax.train.losses import head_mean_loss, head_token_nll

# mt_cpu's batching (three length buckets, one pair a row, every test set decoded) against compare_mt_cpu's.
DEFAULT_CASES = ("buckets3:data.pack_pairs=False,data.length_buckets=3,decode.sets=all;"
                 "packed:data.pack_pairs=True,data.length_buckets=1,decode.sets=primary")


def load_config(path: str):
  import importlib.util
  spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def build(config, workdir: pathlib.Path, shared_data: pathlib.Path) -> Experiment:
  """The case's ``Experiment`` in ``workdir`` with ``data/`` a link to the prepared ``shared_data``."""
  workdir.mkdir(parents=True, exist_ok=True)
  if not (workdir / "data").exists():
    (workdir / "data").symlink_to(shared_data.resolve(), target_is_directory=True)
  return Experiment(config, workdir)


def best_seconds(fn, *args, calls: int = 5) -> float:
  """The fastest of ``calls`` timed calls after a compiling one: this machine is a VM whose cores other machines
  share, so the slower calls measure them."""
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return min(times)


def one_row_batch(exp: Experiment, rows: int) -> dict:
  """A [rows, train.seq_len] batch of real training pairs, one a row."""
  it = batch_lib.MixedPairIterator(exp.data.split_sets("train"), rows, exp.config.train.seq_len, 0,
                                   exp.config.data.sampling_temperature)
  picks, length = it.draw()
  return batch_lib.make_rows(picks, rows, length)


def step_parts(exp: Experiment, batch: dict) -> dict:
  """Seconds of forward + backward of each part of the translation model on ``batch`` (see the module doc)."""
  model, task = exp.model, exp.task
  state = exp.init_state()
  params = state.params
  stage1 = jnp.array(False)
  rngs = step_rngs(jax.random.key(0))
  source, decoder_inputs = jnp.asarray(batch["source"]), jnp.asarray(batch["decoder_inputs"])

  def encode(p):
    return model.apply({"params": p}, source, stage1, False, method=model.encode, rngs=rngs)

  encoded = jax.jit(encode)(params)
  hidden = jax.jit(lambda p, e: model.apply({"params": p}, e, source, decoder_inputs, stage1, False,
                                            method=model.decode, rngs=rngs).hidden)(params, encoded)
  embedding = params["embed"]["embedding"]
  vocab = exp.config.model.vocab_size

  encoder = jax.jit(jax.grad(lambda p: jnp.sum(encode(p) * encoded)))
  decoder = jax.jit(jax.grad(lambda p, e: jnp.sum(model.apply(
      {"params": p}, e, source, decoder_inputs, stage1, False, method=model.decode,
      rngs=rngs).hidden * hidden), argnums=(0, 1)))
  # The head on whole logits (chunk_tokens 0), whatever model.loss_chunk_tokens says.
  head = jax.jit(jax.grad(lambda h, w: task.train_loss(HeadInputs(h, w, vocab, 0), batch), argnums=(0, 1)))
  grads = jax.tree.map(jnp.ones_like, params)
  update = jax.jit(lambda g, o, p: exp.tx.update(g, o, p))
  train_step = exp.jit_train_step()

  def step(s):
    return train_step(s, batch)[0]

  calls = {"encoder": (encoder, params), "decoder_without_head": (decoder, params, encoded),
           "head_and_loss": (head, hidden, embedding), "optimizer_update": (update, grads, state.opt_state, params)}
  parts = {name: best_seconds(fn, *args) for name, (fn, *args) in calls.items()}
  flops = {f"{name}_gflop": xla_flops(fn, *args) / 1e9 for name, (fn, *args) in calls.items()}
  state = jax.block_until_ready(step(state))  # compile (the state is donated: each call takes the last output)
  times = []
  for _ in range(5):
    start = time.perf_counter()
    state = jax.block_until_ready(step(state))
    times.append(time.perf_counter() - start)
  parts["train_step"] = min(times)
  return {**{k: round(v, 4) for k, v in parts.items()}, **{k: round(v, 2) for k, v in flops.items()}}


def xla_flops(fn, *args) -> float:
  """XLA's count of the floating-point operations of ``fn(*args)`` (its cost analysis of the compiled program)."""
  cost = fn.lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("flops", 0.0))


def eval_timings(exps: list[Experiment], decode_sentences: int) -> dict:
  """Seconds of one evaluation batch of each case's kind (interleaved, fastest of 5 rounds) and of beam search
  per sentence (de-en ``test_2016_flickr``, the first case's model, which decodes as every case's does)."""
  batches = [next(iter(e.task.eval_batches(e.data, e.config, "valid"))) for e in exps]
  params = [e.init_state().params for e in exps]
  for e, p, b in zip(exps, params, batches):
    jax.block_until_ready(e.eval_step(p, b))  # compile
  best = [float("inf")] * len(exps)
  for _ in range(5):
    for k, (e, p, b) in enumerate(zip(exps, params, batches)):
      start = time.perf_counter()
      jax.block_until_ready(e.eval_step(p, b))
      best[k] = min(best[k], time.perf_counter() - start)
  cfg = exps[0].config
  settings = bleu_report.decode_settings(cfg)
  translate_fn = make_translate_fn(exps[0].settings.model, settings["beam_size"], settings["max_len"],
                                   settings["length_penalty"])
  lines = exps[0].data.raw_text("de-en", "test_2016_flickr")[0][:decode_sentences]
  translate = lambda: translate_lines(translate_fn, params[0], exps[0].data.tokenizer, "de", lines,
                                      cfg.decode.batch_size, cfg.eval.seq_len)
  translate()  # compile
  per_sentence = min(translate().seconds for _ in range(2)) / len(lines)
  return {"eval_batch_s": best, "beam_s_per_sentence": per_sentence}


def per_run_costs(exp: Experiment, eval_batch_s: float, beam_s_per_sentence: float) -> dict:
  """Seconds evaluation adds to a run of ``train.steps`` at the measured unit costs (see the module doc)."""
  cfg = exp.config
  train = cfg.train
  layers = len([k for k in exp.init_state().params if "_moe_" in k])
  count = lambda split: sum(1 for _ in exp.task.eval_batches(exp.data, exp.settings, split))
  points = len(range(train.eval_every, train.steps, train.eval_every))
  records = train.steps // cfg.analysis.record_every + 1 if cfg.analysis.record_every else 0
  periodic = points * train.eval_batches * (1 + layers) * eval_batch_s
  final_batches = count("valid") * (2 + layers) + count("test")  # valid, test, contributions (+ the full model)
  sets = exp.data.split_sets("test")
  primary_names = bleu_report.primary_set_names(sets)
  decoded = sum(len(s) for s in sets if exp.settings.decode.sets == "all" or primary_names[s.pair] == s.name)
  seconds = {"periodic_eval_s": periodic, "records_s": records * eval_batch_s,
             "final_nll_and_contributions_s": final_batches * eval_batch_s,
             "final_bleu_s": decoded * beam_s_per_sentence}
  return {"steps": train.steps, "moe_layers": layers, "eval_batch_s": round(eval_batch_s, 4),
          "valid_batches": count("valid"), "test_batches": count("test"), "decode_sets": exp.settings.decode.sets,
          "decoded_sentences": decoded, "beam_sentences_per_s": round(1 / beam_s_per_sentence, 2),
          **{k: round(v, 1) for k, v in seconds.items()}, "evaluation_s": round(sum(seconds.values()), 1)}


def loss_check(exp: Experiment, it: batch_lib.MixedPairIterator, params) -> dict:
  """One packed batch's pairs scored packed and one a row (no dropout, inference routing)."""
  packed, picks = it.next_packed()
  alone = batch_lib.make_rows(picks, len(picks), exp.config.train.seq_len)
  model, task = exp.model, exp.task
  smoothing = exp.config.train.label_smoothing

  def score(batch):
    output = model.apply({"params": params}, *task.model_inputs(batch), jnp.array(False), deterministic=True,
                         **task.model_keywords(batch))
    weights = batch["weights"]
    return (head_mean_loss(output, batch["targets"], weights, smoothing),
            jnp.sum(head_token_nll(output, batch["targets"]) * weights))

  (packed_loss, packed_nll), (alone_loss, alone_nll) = score(packed), score(alone)
  return {"pairs": len(picks), "packed_rows": int(packed["source"].shape[0]), "alone_rows": len(picks),
          "mean_loss_packed": float(packed_loss), "mean_loss_alone": float(alone_loss),
          "mean_loss_abs_diff": float(abs(packed_loss - alone_loss)),
          "nll_sum_rel_diff": float(abs(packed_nll - alone_nll) / abs(alone_nll))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/compare_mt_cpu.py")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--cases", default=DEFAULT_CASES)
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--decode_sentences", type=int, default=128)
  parser.add_argument("--noparts", action="store_true", help="skip the parts and per-run rows")
  parser.add_argument("--parts_only", action="store_true", help="only the parts rows (no per-run, no cases)")
  parser.add_argument("--out", type=pathlib.Path)
  args = parser.parse_args()
  out = JsonLines(args.out)
  base = load_config(args.config)
  base.data.data_dir = base.data.data_dir or os.environ.get("STABLEMOE_DATA_DIR", "")
  workdir = pathlib.Path(args.workdir)
  shared = workdir / "data"
  cases = parse_cases(args.cases)
  exps = {}
  for case in cases:
    config = apply_overrides(base, case.overrides)
    if not shared.exists():  # the first case prepares the data in place
      exps[case.name] = Experiment(config, workdir)
    else:
      exps[case.name] = build(config, workdir / case.name, shared)
  first = exps[cases[0].name]
  per_run: dict[str, dict] = {}
  out.add({"row": "env", "device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
           "jax": jax.__version__, "cpu_count": os.cpu_count(), "config": args.config})
  if not args.noparts:
    batch = one_row_batch(first, first.config.train.batch_size)
    dense = build(apply_overrides(first.config, {"model.moe.enabled": False}), workdir / "dense_parts", shared)
    for name, exp in (("moe", first), ("dense", dense)):
      out.add({"row": "parts", "model": name, "batch": list(batch["source"].shape), **step_parts(exp, batch)})
    if args.parts_only:
      out.save()
      return
    timings = eval_timings(list(exps.values()), args.decode_sentences)
    for (name, exp), eval_batch_s in zip(exps.items(), timings["eval_batch_s"]):
      per_run[name] = per_run_costs(exp, eval_batch_s, timings["beam_s_per_sentence"])
      out.add({"row": "per_run", "case": name, **per_run[name]})

  runs = {}
  for name, exp in exps.items():
    state, step, it = exp.init_state(), exp.jit_train_step(), exp.train_batches()
    shapes = set(batch_lib.length_buckets(exp.settings.data.length_buckets, exp.config.train.seq_len))
    start = time.perf_counter()
    seen = set()
    while not shapes <= seen:  # compile every batch shape before timing
      batch = next(it)
      seen.add(batch["source"].shape[1])
      state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
    out.add({"row": "warmup", "case": name, "shapes": sorted(seen), "seconds": round(time.perf_counter() - start, 1)})
    runs[name] = {"state": state, "step": step, "it": it, "rounds": []}
  for _ in range(args.rounds):
    for name, run in runs.items():
      target = source = positions = 0.0
      seconds = 0.0
      for _ in range(args.steps):
        batch = next(run["it"])
        start = time.perf_counter()
        run["state"], metrics = run["step"](run["state"], batch)
        jax.block_until_ready(metrics)
        seconds += time.perf_counter() - start
        target += float(batch["weights"].sum())
        source += float((batch["source"] != 0).sum())
        positions += batch["weights"].size
      run["rounds"].append({"target_per_s": target / seconds, "source_per_s": source / seconds,
                            "step_s": seconds / args.steps, "target_fill": target / positions,
                            "source_fill": source / positions})
  reference = runs[cases[0].name]["rounds"]
  for name, run in runs.items():
    rounds = run["rounds"]
    med = lambda key: statistics.median(r[key] for r in rounds)
    out.add({"row": "case", "case": name, "overrides": next(c.overrides for c in cases if c.name == name),
             "step_s": round(med("step_s"), 3), "target_tokens_per_s": round(med("target_per_s"), 1),
             "source_tokens_per_s": round(med("source_per_s"), 1), "target_fill": round(med("target_fill"), 3),
             "source_fill": round(med("source_fill"), 3),
             "target_tokens_per_s_vs_first": round(statistics.median(
                 r["target_per_s"] / ref["target_per_s"] for r, ref in zip(rounds, reference)), 3),
             "best_round_target_tokens_per_s": round(max(r["target_per_s"] for r in rounds), 1),
             "rounds": len(rounds), "steps_per_round": args.steps})
  whole = {}
  for name, run in runs.items():
    if name in per_run:
      rounds, steps = run["rounds"], per_run[name]["steps"]
      step_s = statistics.median(r["step_s"] for r in rounds)
      tokens = statistics.median(r["target_per_s"] * r["step_s"] for r in rounds)  # real target tokens a step
      seconds = steps * step_s + per_run[name]["evaluation_s"]
      whole[name] = steps * tokens / seconds
      out.add({"row": "whole_run", "case": name, "run_seconds": round(seconds), "target_tokens": round(steps * tokens),
               "target_tokens_per_s": round(whole[name], 1),
               "vs_first": round(whole[name] / whole[cases[0].name], 3)})
  for name, exp in exps.items():
    if exp.settings.data.pack_pairs:
      out.add({"row": "loss_check", "case": name, **loss_check(exp, runs[name]["it"], runs[name]["state"].params)})
  out.save()


if __name__ == "__main__":
  main()

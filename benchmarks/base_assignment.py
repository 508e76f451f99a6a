"""BASE Layer's balanced assignment: its time, and its share of a train step at the same shape.

    python -m benchmarks.base_assignment [--tokens 16384 --experts 64 --batch 128 --repeats 3]

Measures, in one run on one device: (1) ``balanced_assignment`` alone on the scores [T, N] of T tokens
(random normal scores, the scale of a trained router's; rounds and convergence reported), (2) a full train step
of the default model with ``router=base`` and (3) the same step with greedy routing (``router=stablemoe``),
all with T tokens per step and N experts. Prints the assignment's time as a share of the BASE step, and the
BASE step's time relative to the greedy one.
"""
from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

from benchmarks.moe_layer import time_fn
from configs import default
from stablemoe_jax.experiment.step import make_train_step
from stablemoe_jax.models.balanced_assignment import balanced_assignment
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.tasks.lm import LanguageModelTask
from stablemoe_jax.train.optimizer import make_optimizer
from stablemoe_jax.train.state import create_train_state
from stablemoe_jax.core.settings import from_config


def train_step_seconds(router: str, tokens: int, experts: int, batch: int, repeats: int) -> float:
  config = default.get_config()
  config.model.vocab_size = 10000
  config.model.moe.router, config.model.moe.num_experts = router, experts
  config.train.batch_size, config.train.seq_len = batch, tokens // batch
  config.model.max_len = max(config.model.max_len, tokens // batch)
  run = from_config(config)
  model, tx = TransformerLM(run.model), make_optimizer(run.train)
  state = create_train_state(model, tx, 0, config.train.seq_len)
  ids = jax.random.randint(jax.random.key(1), (batch, tokens // batch + 1), 0, 10000)
  data = {"inputs": ids[:, :-1], "targets": ids[:, 1:], "weights": jnp.ones(ids[:, 1:].shape)}
  step = jax.jit(make_train_step(model, tx, run, LanguageModelTask()))
  return time_fn(lambda s: step(s, data)[1]["loss"], state, repeats=repeats)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=16384)
  parser.add_argument("--experts", type=int, default=64)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  print(f"device: {jax.devices()[0].device_kind}; {args.tokens} tokens x {args.experts} experts")

  scores = jax.random.normal(jax.random.key(0), (args.tokens, args.experts))
  assign = jax.jit(functools.partial(balanced_assignment))
  _, info = assign(scores)
  assignment = time_fn(lambda s: assign(s)[0], scores, repeats=args.repeats)
  print(f"balanced_assignment: {assignment * 1e3:.1f} ms, {int(info['rounds'])} auction rounds, "
        f"converged={bool(info['converged'])}")
  base = train_step_seconds("base", args.tokens, args.experts, args.batch, args.repeats)
  greedy = train_step_seconds("stablemoe", args.tokens, args.experts, args.batch, args.repeats)
  print(f"train step, router=base: {base * 1e3:.1f} ms; router=stablemoe (greedy): {greedy * 1e3:.1f} ms")
  print(f"assignment share of the BASE step: {assignment / base:.1%}; BASE step / greedy step: {base / greedy:.2f}")


if __name__ == "__main__":
  main()

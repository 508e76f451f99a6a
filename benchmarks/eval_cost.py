"""Evaluation cost of the default model without drops: index (capacity = every token) vs grouped vs dense.

Times the jitted evaluation forward (``deterministic=True``, logits of an eval batch) of the model of
``configs/default.py`` with ``model.moe.eval_dispatcher`` index and grouped (``eval_capacity_factor``
<= 0: nothing dropped), and of the same model with the MoE layer off (dense), in one run; prints JSON
with the medians and the ratios against dense. Random parameters with non-zero expert output projections
and random token ids: the routing is not a trained one, which changes only how evenly rows fill the
grouped dispatcher's blocks.

  python -m benchmarks.eval_cost [--batch 32 --seq_len 128 --vocab 10000 --repeats 10 --block_size 128]
"""
from __future__ import annotations

import argparse
import json

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks.moe_layer import time_fn
from configs import default
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.core.settings import ModelSettings, typed


def model_config(vocab: int, eval_dispatcher: str, moe: bool, block_size: int):
  config = default.get_config()
  model = config.model
  model.vocab_size = vocab
  model.moe.enabled = moe
  model.moe.eval_dispatcher = eval_dispatcher
  model.moe.block_size = block_size
  assert model.moe.eval_capacity_factor <= 0, "the default evaluates without drops"
  return model


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--vocab", type=int, default=10000)
  parser.add_argument("--block_size", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()

  tokens = jax.random.randint(jax.random.key(0), (args.batch, args.seq_len), 0, args.vocab)
  results = {"device": str(jax.devices()[0].device_kind), "args": vars(args)}
  outputs = {}
  for name, dispatcher, moe in (("dense", "auto", False), ("index", "index", True), ("grouped", "grouped", True)):
    model = TransformerLM(typed(ModelSettings, model_config(args.vocab, dispatcher, moe, args.block_size)))
    params = nn.unbox(model.init(jax.random.key(1), tokens[:1], jnp.array(False))["params"])
    # Zero-initialised output projections would make every expert the identity; give them weights.
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: 0.02 * jax.random.normal(jax.random.key(2), p.shape) if "w_out" in str(path) else p, params)
    forward = jax.jit(lambda params, tokens, model=model: model.apply({"params": params}, tokens,
                                                                      jnp.array(False)).logits())
    results[f"{name}_eval_s"] = time_fn(forward, params, tokens, repeats=args.repeats)
    outputs[name] = forward(params, tokens)
  for name in ("index", "grouped"):
    results[f"{name}_over_dense"] = results[f"{name}_eval_s"] / results["dense_eval_s"]
  results["index_over_grouped"] = results["index_eval_s"] / results["grouped_eval_s"]
  results["max_abs_logit_diff_grouped_vs_index"] = float(jnp.max(jnp.abs(outputs["grouped"] - outputs["index"])))
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  main()

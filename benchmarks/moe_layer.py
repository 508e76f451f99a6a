"""MoE layer speed: each dispatcher (``model.moe.dispatcher``) vs a dense FFN of the same active FLOPs.

Each variant runs forward + backward under jit on the same tokens; the dense
FFN (every token through ``sublayers`` FFN sublayers, no routing) is the
baseline measured in the same run, so the ratios carry across machines. The
dispatchers are chosen through the layer's config, as a run would:
``index`` (scatter / gather), ``one_hot`` (GShard's [T, E, C] einsum) and
``all_to_all`` (the expert-parallel one, here on a mesh of this process's first
device, so it measures the shard_map overhead without communication).

  python -m benchmarks.moe_layer [--tokens 4096 --d_model 256 --d_ff 1024 --experts 8 --sublayers 2 --groups 1]
"""
from __future__ import annotations

import argparse
import json
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from stablemoe_jax.models.experts import FFNExperts, apply_ffn_experts
from stablemoe_jax.models.moe import MoELayer
from stablemoe_jax.parallel import mesh as mesh_lib

DISPATCHERS = ("index", "one_hot", "all_to_all")


def time_fn(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(repeats):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / repeats


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--tokens", type=int, default=4096)
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--d_ff", type=int, default=1024)
  parser.add_argument("--experts", type=int, default=8)
  parser.add_argument("--sublayers", type=int, default=2)
  parser.add_argument("--groups", type=int, default=1)
  parser.add_argument("--capacity_factor", type=float, default=2.0)
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()

  x = jax.random.normal(jax.random.key(0), (1, args.tokens, args.d_model))
  ids = jax.random.randint(jax.random.key(1), (1, args.tokens), 0, 10000)
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict({"expert": 1}), jax.devices()[:1])
  grad = lambda f: mesh_lib.under_mesh(mesh, jax.jit(jax.grad(f, argnums=(0, 1))))

  dense = FFNExperts(1, args.sublayers, args.d_ff)
  dense_params = nn.unbox(dense.init(jax.random.key(3), args.d_model)["params"])

  def dense_loss(params, x):
    y = apply_ffn_experts(params, x[None], jnp.arange(1), jnp.arange(1), None)[0]
    return jnp.sum((x + y) ** 2)

  results = {"device": str(jax.devices()[0].device_kind), "args": vars(args)}
  results["dense_ffn_s"] = time_fn(grad(dense_loss), dense_params, x, repeats=args.repeats)
  for name in DISPATCHERS:
    cfg = ml_collections.ConfigDict(dict(
        router="stablemoe", num_experts=args.experts, capacity_factor=args.capacity_factor,
        eval_capacity_factor=args.capacity_factor, num_groups=args.groups, shuffle_tokens=False, dispatcher=name,
        stablemoe=dict(balance_alpha=0.3, centroid_gain=0.1)))
    layer = MoELayer(cfg, 10000, args.sublayers, args.d_ff)
    with jax.set_mesh(mesh):
      params = nn.unbox(layer.init(jax.random.key(2), x, ids, jnp.array(True))["params"])

    def moe_loss(params, x, layer=layer):
      return jnp.sum(layer.apply({"params": params}, x, ids, jnp.array(True)) ** 2)

    results[f"moe_{name}_s"] = time_fn(grad(moe_loss), params, x, repeats=args.repeats)
    results[f"moe_{name}_over_dense"] = results[f"moe_{name}_s"] / results["dense_ffn_s"]
  results["tokens_per_s_index_dispatch"] = args.tokens / results["moe_index_s"]
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  main()

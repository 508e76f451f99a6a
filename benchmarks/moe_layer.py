"""MoE layer speed: index dispatch vs one-hot [T, E, C] dispatch vs a dense FFN of the same active FLOPs.

Each variant runs forward + backward under jit on the same tokens; the dense
FFN (every token through ``sublayers`` FFN sublayers, no routing) is the
baseline measured in the same run, so the ratios carry across machines.

  python -m benchmarks.moe_layer [--tokens 4096 --d_model 256 --d_ff 1024 --experts 8 --sublayers 2]
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import ml_collections

from stablemoe_jax.models import dispatch as dispatch_lib
from stablemoe_jax.models.experts import FFNExperts
from stablemoe_jax.models.moe import MoELayer


class OneHotDispatcher(dispatch_lib.IndexDispatcher):
  """GShard-style dispatch through a dense [T, E, C] mask, for comparison only."""

  def _mask(self):
    flat = jax.nn.one_hot(self.slot, self.num_experts * self.capacity, dtype=jnp.float32)  # [T, E*C]
    return flat.reshape(-1, self.num_experts, self.capacity)

  def dispatch(self, x):
    return jnp.einsum("tec,td->ecd", self._mask().astype(x.dtype), x)

  def combine(self, y):
    return jnp.einsum("tec,ecd->td", self._mask().astype(y.dtype), y)


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
  parser.add_argument("--capacity_factor", type=float, default=2.0)
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()

  cfg = ml_collections.ConfigDict(dict(
      router="stablemoe", num_experts=args.experts, capacity_factor=args.capacity_factor,
      eval_capacity_factor=args.capacity_factor,
      stablemoe=dict(balance_alpha=0.3, distill_weight=1.0, distill_dim=50, centroid_gain=0.1)))
  x = jax.random.normal(jax.random.key(0), (1, args.tokens, args.d_model))
  ids = jax.random.randint(jax.random.key(1), (1, args.tokens), 0, 10000)
  layer = MoELayer(cfg, 10000, args.sublayers, args.d_ff)
  params = layer.init(jax.random.key(2), x, ids, jnp.array(True))["params"]

  def moe_loss(params, x):
    return jnp.sum(layer.apply({"params": params}, x, ids, jnp.array(True)) ** 2)

  dense = FFNExperts(1, args.sublayers, args.d_ff)
  dense_params = dense.init(jax.random.key(3), x)["params"]

  def dense_loss(params, x):
    return jnp.sum((x + dense.apply({"params": params}, x)) ** 2)

  grad = lambda f: jax.jit(jax.grad(f, argnums=(0, 1)))
  results = {"device": str(jax.devices()[0].device_kind), "args": vars(args)}
  results["dense_ffn_s"] = time_fn(grad(dense_loss), dense_params, x, repeats=args.repeats)
  results["moe_index_dispatch_s"] = time_fn(grad(moe_loss), params, x, repeats=args.repeats)
  original = dispatch_lib.IndexDispatcher
  dispatch_lib.IndexDispatcher = OneHotDispatcher
  try:
    results["moe_one_hot_dispatch_s"] = time_fn(grad(moe_loss), params, x, repeats=args.repeats)
  finally:
    dispatch_lib.IndexDispatcher = original
  for name in ("moe_index_dispatch_s", "moe_one_hot_dispatch_s"):
    results[name.replace("_s", "_over_dense")] = results[name] / results["dense_ffn_s"]
  results["tokens_per_s_index_dispatch"] = args.tokens / results["moe_index_dispatch_s"]
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  main()

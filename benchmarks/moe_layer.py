"""MoE layer speed: each dispatcher (``model.moe.dispatcher``) vs a dense FFN of the same active FLOPs.

Each variant runs forward + backward under jit on the same tokens (and the
forward alone, as evaluation does); the dense FFN (every token through
``sublayers`` FFN sublayers, no routing) is the baseline measured in the same
run, so the ratios carry across machines. The dispatchers are chosen through
the layer's config, as a run would: ``index`` (scatter / gather), ``grouped``
(expert-sorted rows in blocks, real rows only), ``one_hot`` (GShard's [T, E, C]
einsum) and ``all_to_all`` (the expert-parallel one, here on a mesh of this
process's first device, so it measures the shard_map overhead without
communication). ``--capacity_factor 0`` is evaluation without drops
(capacity = every token of a group). ``--autodiff_check`` also times the grouped
dispatcher with JAX's own scan gradient instead of its custom VJP.
Times are medians of ``--repeats`` calls.

  python -m benchmarks.moe_layer [--tokens 4096 --d_model 256 --d_ff 1024 --experts 8 --sublayers 2 --groups 1
                                  --capacity_factor 2.0 --block_size 128 --dispatchers index,grouped]
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from stablemoe_jax.core.settings import MoESettings, typed
from stablemoe_jax.models import buffers as buffers_lib
from stablemoe_jax.models import dispatch
from stablemoe_jax.models import grouped_dispatch
from stablemoe_jax.models.experts import FFNExperts, apply_ffn_experts
from stablemoe_jax.models.moe import make_moe_layer
from stablemoe_jax.parallel import mesh as mesh_lib

DISPATCHERS = ("index", "grouped", "one_hot", "all_to_all")


def time_fn(fn, *args, repeats: int) -> float:
  """Median seconds of one call (after a compiling call): robust to other jobs on a shared machine."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def grouped_autodiff_dispatch(x, slots, expert_params, rng, *, expert_fn, num_experts, capacity, block_size):
  """The grouped dispatcher with autodiff of its block scan (no custom VJP): the per-block weight slice's
  gradient is a zero-padded [E, ...] tensor added to the accumulator each block."""
  groups, group_size, d = x.shape
  block_size = max(1, min(block_size, groups * group_size, groups * num_experts * capacity))
  row, block_expert = grouped_dispatch.grouped_rows(slots, num_experts, capacity, block_size)
  num_rows = block_expert.shape[0] * block_size
  blocks = buffers_lib.gather_rows(x.reshape(-1, d), buffers_lib.inverse_index(row, num_rows))
  run_blocks = grouped_dispatch._block_experts(expert_fn, num_experts).fun  # pylint: disable=protected-access
  y = run_blocks(expert_params, blocks.reshape(-1, block_size, d), block_expert, rng)
  return buffers_lib.gather_rows(y.reshape(num_rows, d), row).reshape(groups, group_size, d)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--tokens", type=int, default=4096)
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--d_ff", type=int, default=1024)
  parser.add_argument("--experts", type=int, default=8)
  parser.add_argument("--sublayers", type=int, default=2)
  parser.add_argument("--groups", type=int, default=1)
  parser.add_argument("--capacity_factor", default="2.0",
                      help="comma-separated; one JSON line each (<= 0: no token dropped, as in evaluation)")
  parser.add_argument("--block_size", default="128", help="grouped dispatcher's row blocks, comma-separated: "
                      "grouped runs at each (named grouped_b<size> when more than one)")
  parser.add_argument("--dispatchers", default=",".join(DISPATCHERS), help="comma-separated subset")
  parser.add_argument("--autodiff_check", action="store_true")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--dtype", default="float32", help="compute dtype of the FFN matmuls (bfloat16 on GPUs)")
  args = parser.parse_args()
  dtype = jnp.dtype(args.dtype)
  block_sizes = [int(b) for b in args.block_size.split(",")]
  names = []  # (result name, dispatcher, block size)
  for name in args.dispatchers.split(","):
    sizes = block_sizes if name == "grouped" else block_sizes[:1]
    names += [(f"{name}_b{b}" if len(sizes) > 1 else name, name, b) for b in sizes]
  if args.autodiff_check:
    dispatch.DISPATCHERS["grouped_autodiff"] = functools.partial(  # this process only
        grouped_autodiff_dispatch, block_size=block_sizes[0])
    names.append(("grouped_autodiff", "grouped_autodiff", block_sizes[0]))

  x = jax.random.normal(jax.random.key(0), (1, args.tokens, args.d_model)).astype(dtype)
  ids = jax.random.randint(jax.random.key(1), (1, args.tokens), 0, 10000)
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict({"expert": 1}), jax.devices()[:1])
  grad = lambda f: mesh_lib.under_mesh(mesh, jax.jit(jax.grad(f, argnums=(0, 1))))

  dense = FFNExperts(1, args.sublayers, args.d_ff)
  dense_params = nn.unbox(dense.init(jax.random.key(3), args.d_model)["params"])

  def dense_loss(params, x):
    y = apply_ffn_experts(params, x[None], jnp.arange(1), jnp.arange(1), None, dtype=dtype)[0]
    return jnp.sum(((x + y) ** 2).astype(jnp.float32))

  dense_fwd = lambda params, x: x + apply_ffn_experts(params, x[None], jnp.arange(1), jnp.arange(1), None,
                                                     dtype=dtype)[0]
  dense_s = time_fn(grad(dense_loss), dense_params, x, repeats=args.repeats)
  dense_fwd_s = time_fn(jax.jit(dense_fwd), dense_params, x, repeats=args.repeats)
  for capacity_factor in (float(c) for c in args.capacity_factor.split(",")):
    results = {"device": str(jax.devices()[0].device_kind), "args": {**vars(args), "capacity_factor": capacity_factor},
               "dense_ffn_s": dense_s, "dense_ffn_fwd_s": dense_fwd_s}
    for result_name, name, block_size in names:
      cfg = ml_collections.ConfigDict(dict(
          router="stablemoe", num_experts=args.experts, capacity_factor=capacity_factor,
          eval_capacity_factor=capacity_factor, num_groups=args.groups, shuffle_tokens=False, dispatcher=name,
          eval_dispatcher=name, block_size=block_size, stablemoe=dict(balance_alpha=0.3, centroid_gain=0.1)))
      with jax.set_mesh(mesh):  # the layer's groups and dispatchers are resolved for the mesh where it is built
        layer = make_moe_layer(typed(MoESettings, cfg), 10000, args.sublayers, args.d_ff, dtype=dtype)
        params = nn.unbox(layer.init(jax.random.key(2), x, ids, jnp.array(True))["params"])

      def moe_loss(params, x, layer=layer):
        return jnp.sum((layer.apply({"params": params}, x, ids, jnp.array(True)) ** 2).astype(jnp.float32))

      results[f"moe_{result_name}_s"] = time_fn(grad(moe_loss), params, x, repeats=args.repeats)
      results[f"moe_{result_name}_over_dense"] = results[f"moe_{result_name}_s"] / dense_s
      forward = jax.jit(functools.partial(layer.apply, deterministic=True))
      with jax.set_mesh(mesh):
        results[f"moe_{result_name}_fwd_s"] = time_fn(forward, {"params": params}, x, ids, jnp.array(True),
                                                      repeats=args.repeats)
      results[f"moe_{result_name}_fwd_over_dense"] = results[f"moe_{result_name}_fwd_s"] / dense_fwd_s
    if "moe_index_s" in results:
      results["tokens_per_s_index_dispatch"] = args.tokens / results["moe_index_s"]
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
  main()

"""benchmarks/step_ops.py: op counts by hand, and the dense step against the plain GPT-2 reference."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks import op_counts, step_ops
from tests.benchmarks.test_throughput import _tiny_config


def test_jaxpr_counts_by_hand():
  """Two casts, one bf16 dot and one transpose per scan iteration, three iterations."""
  def body(carry, w):
    y = carry.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)  # [4, 8] x [8, 8]
    return y.T.astype(jnp.float32), None

  closed = jax.make_jaxpr(lambda x, ws: jax.lax.scan(body, x, ws)[0])(jnp.ones((8, 8)), jnp.ones((3, 8, 8)))
  counts = op_counts.jaxpr_counts(closed)
  assert counts["convert f32->bf16"] == 6 and counts["convert f32->bf16 elements"] == 6 * 64
  assert counts["convert bf16->f32"] == 3 and counts["convert"] == 9
  assert counts["dot bf16xbf16->bf16"] == 3 and counts["dot_flops"] == 3 * 2 * 8 * 8 * 8
  assert counts["transpose"] == 3 and counts["transpose elements"] == 3 * 64
  assert "dot f32xf32->f32" not in counts


def test_hlo_counts_by_hand():
  text = """HloModule m
fused_computation {
  p = f32[4,8]{1,0} parameter(0)
  ROOT c = bf16[4,8]{1,0} convert(p)
}
ENTRY main {
  %a = f32[4,8]{1,0} parameter(0)
  %f = bf16[4,8]{1,0} fusion(f32[4,8]{1,0} %a), kind=kLoop, calls=fused_computation
  %t = bf16[8,4]{1,0} transpose(bf16[4,8]{1,0} %f), dimensions={1,0}
  %g = (bf16[4,4]{1,0}, s8[16]{0}) custom-call(bf16[4,8]{1,0} %f, bf16[8,4]{1,0} %t), custom_call_target="__cublas$gemm"
  %d = f32[4,4]{1,0} dot(f32[4,8]{1,0} %a, f32[8,4]{1,0} %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %l = (f32[4,4]{1,0}, s8[16]{0}) custom-call(%f, %t), custom_call_target="__cublas$lt$matmul"
  %c = (f32[4,4]{1,0}) custom-call(%f), custom_call_target="__cudnn$fmhaSoftmax"
  ROOT %k = f32[4,8]{1,0} copy(f32[4,8]{1,0} %a)
}"""
  counts = op_counts.hlo_counts(text)
  assert counts["convert"] == 1 and counts["transpose"] == 1 and counts["copy"] == 1 and counts["fusion"] == 1
  # operands typed inline, or by name only (their type read from the instruction that defines them)
  assert counts["gemm bf16->bf16"] == 1 and counts["dot f32->f32"] == 1 and counts["gemm bf16->f32"] == 1
  assert counts["custom-call __cudnn$fmhaSoftmax"] == 1 and counts["instructions"] == 10  # the fused computation's two as well


def test_dense_step_matmuls_and_casts_are_the_references():
  """bfloat16 compute: the project's dense step has the reference's matmuls, by dtype, and no more casts or
  transposes of tensors (only scalar bookkeeping: the lr schedule, stage flag, token count). A float32 LM
  head (three float32 GEMMs of 2 V d FLOPs per token each) fails it."""
  config = _tiny_config(num_layers=2)
  config.model.dtype = "bfloat16"
  reference, dense, difference = step_ops.step_rows(config)
  assert reference["step"] == "reference" and dense["step"] == "dense"
  ref, ours = reference["jaxpr"], dense["jaxpr"]
  dots = lambda counts: {k: v for k, v in counts.items() if k.startswith("dot")}
  assert dots(ours) == dots(ref)
  assert not any(k.startswith("dot f32xf32") for k in ours)
  assert ours.get("transpose elements", 0) <= ref.get("transpose elements", 0)
  tensor_casts = lambda counts: sum(v for k, v in counts.items() if k.startswith("convert") and k.endswith("elements"))
  scalar_casts = ours["convert"] - ref["convert"]
  assert tensor_casts(ours) - tensor_casts(ref) <= scalar_casts <= 30, difference

"""Op counts of a traced step (its jaxpr) and of a compiled program (its HLO text), by kind and dtype.

Used by ``benchmarks.step_ops`` (the dense step against the plain GPT-2 reference) and by
``benchmarks.throughput`` (each row's compiled program on the device it ran on).
"""
from __future__ import annotations

import collections
import math
import re

import jax.extend.core as jex

RNG_PRIMITIVES = ("random_bits", "threefry2x32", "random_seed", "random_fold_in", "random_split", "random_wrap",
                  "rng_bit_generator")
_DTYPE_NAMES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "s32", "float64": "f64"}


def _short(dtype) -> str:
  return _DTYPE_NAMES.get(str(dtype), str(dtype))


def jaxpr_counts(closed: jex.ClosedJaxpr, vocab_sizes: tuple[int, ...] = ()) -> dict[str, float]:
  """Op counts of a traced step (see the module docstring); keys like ``convert bf16->f32``, ``dot f32xf32->f32``.

  ``f32 bytes written``: the bytes of every float32 value an equation produces (a scan's body once per iteration;
  a call's outputs counted inside it), before XLA fuses any; ``f32 largest tensor elements`` / ``... shape``: the
  largest of them (the LM's [tokens, vocabulary] logits, unless the loss is chunked); ``f32 [..., V] values``: how
  many float32 values whose last dimension is one of ``vocab_sizes`` have each shape (``f32 [2x1024x50257]``).
  """
  counts: collections.Counter = collections.Counter()
  largest: list = [0, ()]

  def walk(jaxpr: jex.Jaxpr, times: int) -> None:
    for eqn in jaxpr.eqns:
      name = eqn.primitive.name
      counts["equations"] += times
      if not any(True for _ in jex.jaxprs_in_params(eqn.params)):
        for var in eqn.outvars:
          aval = var.aval
          if str(getattr(aval, "dtype", "")) == "float32":
            size = math.prod(aval.shape)
            counts["f32 bytes written"] += times * 4 * size
            if size > largest[0]:
              largest[:] = [size, tuple(aval.shape)]
            if len(aval.shape) > 1 and aval.shape[-1] in vocab_sizes:
              counts[f"f32 [{'x'.join(map(str, aval.shape))}]"] += times
      if name == "convert_element_type":
        aval_in, aval_out = eqn.invars[0].aval, eqn.outvars[0].aval
        key = f"convert {_short(aval_in.dtype)}->{_short(aval_out.dtype)}"
        counts[key] += times
        counts[f"{key} elements"] += times * math.prod(aval_out.shape)
        counts["convert"] += times
      elif name == "dot_general":
        lhs, rhs, out = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
        (contract, _), _ = eqn.params["dimension_numbers"]
        flops = 2 * math.prod(out.shape) * math.prod(lhs.shape[i] for i in contract)
        key = f"dot {_short(lhs.dtype)}x{_short(rhs.dtype)}->{_short(out.dtype)}"
        counts[key] += times
        counts[f"{key} flops"] += times * flops
        counts["dot_flops"] += times * flops
      elif name in ("transpose", "copy", "copy_p") or name in RNG_PRIMITIVES:
        counts[name] += times
        if name == "transpose":
          counts["transpose elements"] += times * math.prod(eqn.outvars[0].aval.shape)
      inner = times * (eqn.params["length"] if name == "scan" else 1)
      for sub in jex.jaxprs_in_params(eqn.params):
        walk(sub.jaxpr if isinstance(sub, jex.ClosedJaxpr) else sub, inner)

  walk(closed.jaxpr, 1)
  counts["f32 largest tensor elements"] = largest[0]
  counts["f32 largest tensor shape"] = "x".join(map(str, largest[1]))
  return dict(sorted(counts.items()))


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_TYPE = re.compile(r"^(\w+)\[")
_OPERAND = re.compile(r"^\s*(?:(\w+)\[[^\]]*\]\S*\s+)?%?([\w.\-]+)")


def _split_type(rest: str) -> tuple[str, str]:
  """``'bf16[2,3]{1,0} dot(...)'`` -> (type, remainder); a tuple type ``(a, b)`` is kept whole."""
  if rest.startswith("("):
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        return rest[: i + 1], rest[i + 1:].lstrip()
  head, _, tail = rest.partition(" ")
  return head, tail


def _dtype(type_text: str) -> str:
  match = _TYPE.match(type_text.lstrip("("))  # a tuple's first element: a GEMM custom call's result
  return match.group(1) if match else "?"


def hlo_counts(text: str) -> dict[str, int]:
  """Instruction counts of a compiled HLO module's text (every computation, fused ones included).

  ``convert``, ``transpose``, ``copy``, ``fusion`` and a few others by opcode; matmuls (``dot``, and GEMM
  custom calls on GPUs) as ``"dot|gemm <first operand dtype>-><result dtype>"``; other custom calls by target.
  """
  instructions = []
  types: dict[str, str] = {}
  for line in text.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      out_type, rest = _split_type(match.group(2))
      types[match.group(1)] = out_type
      instructions.append((line, out_type, rest))
  counts: collections.Counter = collections.Counter()
  for line, out_type, rest in instructions:
    opcode, _, operands = rest.partition("(")
    counts["instructions"] += 1
    if opcode in ("convert", "transpose", "copy", "fusion", "rng-bit-generator", "all-reduce", "while",
                  "scatter", "gather", "sort"):
      counts[opcode] += 1
    if opcode not in ("dot", "custom-call"):
      continue
    first = _OPERAND.match(operands)
    in_dtype = (first.group(1) or _dtype(types.get(first.group(2), ""))) if first else "?"
    kind = "dot"
    if opcode == "custom-call":
      target = re.search(r'custom_call_target="([^"]+)"', line)
      target = target.group(1) if target else "?"
      if "gemm" not in target and "matmul" not in target:
        counts[f"custom-call {target}"] += 1
        continue
      kind = "gemm"
    counts[f"{kind} {in_dtype}->{_dtype(out_type)}"] += 1
  return dict(sorted(counts.items()))

"""Analytic forward FLOPs per token and the shared / expert parameter split, from a parameter tree.

FLOPs count matrix multiplications at 2 per multiply-add (elementwise work -- LayerNorm, softmax,
ReLU, gates -- is left out, as in the papers' counts). Read off the parameter shapes, so any model
built from these modules is covered (dense, deeper, wider, any router):

* every ``kernel`` (Dense, DenseGeneral, convolutions applied once per token): ``2 * size``;
* the tied token embedding (``embed/embedding``) as the LM head: ``2 * V * d`` (the lookup is free; V its rows,
  so a vocabulary padded by ``model.vocab_multiple`` counts the padded columns the head computes);
  a distilled router's embedding is a lookup: 0;
* router ``centroids`` [N, d]: ``2 * N * d`` (every expert's score is computed);
* routed expert weights ``w_in`` [N, s, d, f] and ``w_out`` [N, s, f, d] (under an ``experts`` module):
  ``2 * size / N * rows``, ``rows`` the expert rows a token costs: by default the active count, ``top_k``
  (each of a token's k choices runs one expert FFN); given a ``capacity_factor`` c, what the capacity-padded
  buffers compute, N slots of ``c * k * T / N`` rows a routing group, so ``c * k`` rows a token (capacity counts
  choices, ``models/capacity.py``);
* the same stacked FFN outside an ``experts`` module, every token through each of its [n, s, ...] stacks:
  ``2 * size``: the shared experts (``shared_experts``, [n, ...], ``model.moe.shared_experts``: n expert FFNs a
  token) and the dense baselines' ``dense_ffn_*`` ([1, s, ...]);
* each causal self-attention: ``4 * S * d`` for ``QK^T`` and ``AV`` over all S keys (computed for the
  whole square and masked, as ``jax.nn.dot_product_attention`` does).
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
from flax import traverse_util

EXPERTS_MODULE = "experts"


def _flat(params: Any) -> dict[tuple[str, ...], Any]:
  return traverse_util.flatten_dict(nn.unbox(params))  # expert parameters come boxed with their logical axes


def param_counts(params: Any) -> dict[str, int]:
  """``{'shared', 'expert', 'total'}`` parameter counts; expert = everything under an ``experts`` module (the
  routed experts). Shared experts (``shared_experts``: every token goes through them) count as shared."""
  shared = expert = 0
  for path, leaf in _flat(params).items():
    size = math.prod(leaf.shape)
    if EXPERTS_MODULE in path[:-1]:
      expert += size
    else:
      shared += size
  return {"shared": shared, "expert": expert, "total": shared + expert}


def forward_flops_per_token(params: Any, seq_len: int, capacity_factor: float | None = None, top_k: int = 1) -> int:
  """Forward FLOPs per token of a decoder LM with parameters ``params`` on sequences of ``seq_len``.

  ``top_k``: the experts each token is routed to (``routers.top_k``); ``capacity_factor``: None for the active
  count (``top_k`` expert rows a token), else the capacity-padded buffers' (``capacity_factor`` rows a token).
  """
  rows = top_k if capacity_factor is None else capacity_factor * top_k
  flops = 0.0
  for path, leaf in _flat(params).items():
    size = math.prod(leaf.shape)
    name = path[-1]
    if name == "kernel":
      flops += 2 * size
      if path[-2] == "qkv":  # kernel [d, 3, H, Dh]: scores and weighted values over seq_len keys
        flops += 4 * seq_len * leaf.shape[-2] * leaf.shape[-1]
    elif name == "embedding" and path[:-1] == ("embed",):
      flops += 2 * size
    elif name == "centroids":
      flops += 2 * size
    elif name in ("w_in", "w_out"):
      flops += 2 * size / leaf.shape[0] * rows if EXPERTS_MODULE in path[:-1] else 2 * size
  return int(round(flops))

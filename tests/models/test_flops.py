"""Analytic FLOPs per token against XLA's cost analysis of the compiled forward; the parameter split."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from tests.conftest import jit_init

from configs import default
from stablemoe_jax.models import flops
from stablemoe_jax.models.transformer import TransformerLM, dense_match_plan
from stablemoe_jax.core.settings import ModelSettings, typed

BATCH, SEQ = 4, 32


def _model_config(moe: bool, num_layers: int = 2, affinity: str = "dot"):
  config = default.get_config().model
  config.moe.stablemoe.affinity, config.moe.stablemoe.cosine_dim = affinity, (16 if affinity == "cosine" else 0)
  config.vocab_size, config.d_model, config.num_heads, config.num_layers = 1000, 64, 4, num_layers
  config.d_ff, config.max_len, config.dropout = 256, SEQ, 0.0
  config.moe.enabled, config.moe.num_experts, config.moe.sublayers_per_expert = moe, 4, 2
  config.moe.d_ff = 128
  config.moe.distilled_router.dim = 16
  config.moe.eval_capacity_factor = 1.0  # capacity T / N: the experts compute exactly one token's worth each
  return config


def _xla_flops_per_token(model, params) -> float:
  tokens = jnp.zeros((BATCH, SEQ), jnp.int32)
  forward = lambda p, x: model.apply({"params": p}, x, jnp.array(False), deterministic=True).logits()
  cost = jax.jit(forward).lower(params, tokens).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return cost["flops"] / (BATCH * SEQ)


def _hand_count(d, f, layers, vocab, seq, experts=0, sublayers=0, expert_f=0, distill_dim=0, cosine_dim=0) -> int:
  """Per token: attention projections 8d^2 + scores/values 4 S d, FFN 4 d f per block; LM head 2 d V;
  MoE: router 2 N d (cosine routing: the projection 2 d k, then 2 N k), distilled router 2 N d', one expert's
  sublayers 4 d f_e each."""
  per_block = 8 * d * d + 4 * seq * d + 4 * d * f
  router = 2 * d * cosine_dim + 2 * experts * cosine_dim if cosine_dim else 2 * experts * d
  moe = router + 2 * experts * distill_dim + sublayers * 4 * d * expert_f if experts else 0
  return layers * per_block + 2 * d * vocab + moe


@pytest.mark.parametrize("moe, affinity", [(True, "dot"), (True, "cosine"), (False, "dot")])
def test_analytic_flops_match_hand_count_and_xla_cost_analysis(moe, affinity):
  config = _model_config(moe, affinity=affinity)
  model = TransformerLM(typed(ModelSettings, config))
  params = jit_init(model, 0, jnp.zeros((1, SEQ), jnp.int32), jnp.array(False))["params"]
  analytic = flops.forward_flops_per_token(params, SEQ)
  cosine_dim = 16 if affinity == "cosine" else 0
  expected = _hand_count(64, 256, 2, 1000, SEQ, *((4, 2, 128, 16, cosine_dim) if moe else ()))
  assert analytic == expected
  # XLA also counts the elementwise work (LayerNorm, softmax, ReLU, residuals, gates) that the analytic count
  # leaves out: at this size it adds 2-4%; the bound also catches a matmul counted twice or forgotten.
  xla = _xla_flops_per_token(model, params)
  assert analytic <= xla <= 1.05 * analytic, (analytic, xla)


@pytest.mark.parametrize("dense_match", ["deeper", "wider"])
def test_dense_matched_models_count_every_ffn_sublayer(dense_match):
  config = _model_config(True)
  config.dense_match = dense_match
  model = TransformerLM(typed(ModelSettings, config))
  params = jit_init(model, 0, jnp.zeros((1, SEQ), jnp.int32), jnp.array(False))["params"]
  sublayers, width = dense_match_plan(typed(ModelSettings, config))
  analytic = flops.forward_flops_per_token(params, SEQ)
  assert analytic == _hand_count(64, 256, 2, 1000, SEQ) + sublayers * 4 * 64 * width
  assert flops.param_counts(params)["expert"] == 0
  xla = _xla_flops_per_token(model, params)
  assert analytic <= xla <= 1.05 * analytic, (analytic, xla)


def test_parameter_split_counts_experts_apart():
  config = _model_config(True)
  params = jax.eval_shape(lambda: TransformerLM(typed(ModelSettings, config)).init(
      jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32), jnp.array(False))["params"])
  counts = flops.param_counts(params)
  d, e, s, f = 64, 4, 2, 128
  assert counts["expert"] == e * s * (2 * d + d * f + f + f * d + d)  # LayerNorm, w_in, b_in, w_out, b_out
  dense = jax.eval_shape(lambda: TransformerLM(typed(ModelSettings, _model_config(False))).init(
      jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32), jnp.array(False))["params"])
  router = e * d + 1000 * 16 + e * 16  # centroids (dot routing), distilled embedding and centroids
  assert counts["shared"] == flops.param_counts(dense)["total"] + router
  assert counts["total"] == sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def _routed_config(router: str, top_k: int, shared: int, eval_capacity_factor: float):
  config = _model_config(True)
  config.moe.router, config.moe.shared_experts = router, shared
  if top_k > 1:  # a top-1 router (stablemoe) has no top_k key
    config.moe[router].top_k = top_k
  config.moe.eval_capacity_factor = eval_capacity_factor
  return config


@pytest.mark.parametrize("router, top_k, shared", [("switch", 2, 0), ("stablemoe", 1, 1), ("deepseek", 2, 1)])
def test_topk_and_shared_expert_flops_match_hand_count_and_xla(router, top_k, shared):
  """Each of a token's k choices runs one expert FFN and each shared expert runs for every token: the active count
  is k + n experts' sublayers a token. At eval capacity factor 1 (capacity counts choices: C = ceil(k T / N)) the
  index dispatcher's buffers compute exactly k rows a token, so XLA sees that active count plus the shared
  experts; at capacity factor 1 / k the buffers of a top-1 layer (half of top-2's choices dropped), as the padded
  count says."""
  d, f, experts, sublayers, expert_f = 64, 256, 4, 2, 128
  one_expert = sublayers * 4 * d * expert_f
  distill = 2 * experts * 16 if router == "stablemoe" else 0  # the distilled router's centroids [N, d']
  base = _hand_count(d, f, 2, 1000, SEQ) + 2 * experts * d + distill
  config = _routed_config(router, top_k, shared, eval_capacity_factor=1.0)
  model = TransformerLM(typed(ModelSettings, config))
  params = jit_init(model, 0, jnp.zeros((1, SEQ), jnp.int32), jnp.array(False))["params"]
  active = flops.forward_flops_per_token(params, SEQ, top_k=top_k)
  assert active == base + (top_k + shared) * one_expert
  assert flops.forward_flops_per_token(params, SEQ, capacity_factor=1.0, top_k=top_k) == active
  assert flops.forward_flops_per_token(params, SEQ) == active - (top_k - 1) * one_expert  # the default k is 1
  xla = _xla_flops_per_token(model, params)
  assert active <= xla <= 1.05 * active, (active, xla)
  if top_k > 1:  # capacity factor 1 / k: the slots of a top-1 layer, so one expert row a token is computed
    config = _routed_config(router, top_k, shared, eval_capacity_factor=1.0 / top_k)
    model = TransformerLM(typed(ModelSettings, config))
    padded = flops.forward_flops_per_token(params, SEQ, capacity_factor=1.0 / top_k, top_k=top_k)
    assert padded == base + (1 + shared) * one_expert
    xla = _xla_flops_per_token(model, params)
    assert padded <= xla <= 1.05 * padded, (padded, xla)
  # Shared experts are parameters every token uses: counted as shared, not expert.
  counts = flops.param_counts(params)
  per_expert = sublayers * (2 * d + d * expert_f + expert_f + expert_f * d + d)
  assert counts["expert"] == experts * per_expert
  shared_leaves = sum(math.prod(x.shape) for x in jax.tree.leaves(params["moe_0"].get("shared_experts", {})))
  assert shared_leaves == shared * per_expert


@pytest.mark.parametrize("top_k, shared", [(2, 0), (1, 1), (2, 1)])
def test_flops_matched_dense_model_computes_what_a_topk_token_does(top_k, shared):
  """dense_match="flops": one FFN of the experts' sublayers, (k + n) times as wide: the MoE model's active FLOPs a
  token less its router."""
  moe = _routed_config("switch", top_k, shared, eval_capacity_factor=float(top_k))
  dense = _routed_config("switch", top_k, shared, eval_capacity_factor=float(top_k))
  dense.dense_match = "flops"
  shapes = lambda cfg: jax.eval_shape(lambda: TransformerLM(typed(ModelSettings, cfg)).init(
      jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32), jnp.array(False))["params"])
  assert dense_match_plan(typed(ModelSettings, dense)) == (2, (top_k + shared) * 128)
  router = 2 * 4 * 64  # switch's centroids [N, d]
  assert (flops.forward_flops_per_token(shapes(dense), SEQ)
          == flops.forward_flops_per_token(shapes(moe), SEQ, top_k=top_k) - router)

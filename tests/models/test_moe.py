"""The MoE layer and StableMoE router against independent per-token references."""
import dataclasses
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from tests.conftest import jit_init

from stablemoe_jax.models import buffers as buffers_lib
from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.core.settings import DistilledRouterSettings, MoESettings, ModelSettings, typed
from stablemoe_jax.models.moe import make_moe_layer
from stablemoe_jax.models.routing import STATS, layer_stats, stablemoe_balance_loss
from stablemoe_jax.models.stablemoe_router import StableMoERouter

D, FF, E, SUB, VOCAB = 8, 16, 4, 2, 11


def moe_config(capacity_factor=2.0, eval_capacity_factor=0.0, num_groups=1, dispatcher="index"):
  return ml_collections.ConfigDict(dict(
      router="stablemoe", num_experts=E, capacity_factor=capacity_factor,
      eval_capacity_factor=eval_capacity_factor, d_ff=FF, num_groups=num_groups, shuffle_tokens=False,
      dispatcher=dispatcher,
      stablemoe=dict(balance_alpha=0.3, centroid_gain=0.1),
      distilled_router={**dataclasses.asdict(DistilledRouterSettings()), "dim": 5},
  ))


def randomized(params, seed=1):
  """Replaces every parameter with N(0, 0.5) noise, so zero-initialised projections matter too."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def np_layer_norm(x, scale, bias, eps=1e-5):
  return (x - x.mean()) / np.sqrt(x.var() + eps) * scale + bias


def per_token_reference(params, x, token_ids, stage1, capacity, num_groups=1):
  """The layer's definition, one token at a time, in float64 numpy; capacity counts restart every T / G tokens."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  router, ex = p["router"], p["experts"]
  distilled = router["distilled_router"]
  out = np.array(x, np.float64)
  load = np.zeros(E, int)
  for t in range(x.shape[0]):
    if t % (x.shape[0] // num_groups) == 0:
      load = np.zeros(E, int)  # a new routing group
    h = out[t].copy()
    scores = router["centroids"] @ h
    if stage1:
      e = int(np.argmax(scores))
    else:
      e = int(np.argmax(distilled["centroids"] @ distilled["embedding"][token_ids[t]]))
    load[e] += 1
    if load[e] > capacity:
      continue  # over capacity: the token passes through unchanged
    y = h.copy()
    for s in range(SUB):
      z = np_layer_norm(y, ex["ln_scale"][e, s], ex["ln_bias"][e, s])
      z = np.maximum(z @ ex["w_in"][e, s] + ex["b_in"][e, s], 0.0) @ ex["w_out"][e, s] + ex["b_out"][e, s]
      y = y + z
    gate = 1.0 / (1.0 + np.exp(-scores[e]))
    out[t] = h + gate * (y - h)
  return out


def init_layer(cfg, tokens=12, seed=0):
  """The layer, N(0, 0.5) parameters, inputs x [2, tokens / 2, D] and token ids [2, tokens / 2]."""
  layer = make_moe_layer(typed(MoESettings, cfg), VOCAB, SUB, FF)
  x = jax.random.normal(jax.random.key(seed), (2, tokens // 2, D))
  ids = jax.random.randint(jax.random.key(seed + 1), (2, tokens // 2), 0, VOCAB)
  params = randomized(nn.unbox(jit_init(layer, 2, x, ids, jnp.array(True))["params"]))
  return layer, params, x, ids


def test_expert_capacity_hand_computed_on_non_divisible_cases():
  # ceil(cf * T / N), at least 1, at most T; cf <= 0: T. Hand values, most of them where T / N is not whole.
  cases = {(10, 4, 1.0): 3, (10, 4, 2.0): 5, (7, 3, 1.0): 3, (12, 8, 1.25): 2, (24, 4, 0.75): 5, (8, 4, 0.75): 2,
           (6, 4, 0.1): 1, (5, 2, 4.0): 5, (9, 4, 0.0): 9, (16, 4, 1.0): 4}
  assert {k: capacity_lib.expert_capacity(*k) for k in cases} == cases
  # Top-k: ceil(cf * k * T / N), at most T (a token chooses an expert once).
  topk = {(10, 4, 1.0, 2): 5, (24, 4, 0.75, 2): 9, (8, 4, 0.75, 2): 3, (12, 8, 1.25, 3): 6, (24, 4, 2.0, 2): 24,
          (10, 4, 2.0, 3): 10, (9, 4, 0.0, 2): 9, (16, 8, 1.0, 1): 2}
  assert {k: capacity_lib.expert_capacity(*k) for k in topk} == topk


@pytest.mark.parametrize("args, capacity", [
    ((9, 4, -1.0, 2), 9),  # a negative factor, like 0: no limit
    ((64, 8, 1e-3, 2), 1),  # at least one slot, whatever k
    ((16, 8, 0.5, 2), 2),  # ceil(0.5 * 2 * 16 / 8) = 2 exactly: no rounding up past a whole number
    ((16, 8, 0.5001, 2), 3),  # just over it: the next slot
    ((12, 4, 1.5, 2), 9), ((12, 4, 2.0, 2), 12), ((12, 4, 2.5, 2), 12),  # k * cf * T / N below, at and over T
])
def test_top_k_capacity_at_its_edges(args, capacity):
  assert capacity_lib.expert_capacity(*args) == capacity


@pytest.mark.parametrize("stage1", [True, False])
@pytest.mark.parametrize("capacity_factor", [2.0, 0.75])  # C = 4 and 2 a group of 8, 12 and 5 a group of 24
@pytest.mark.parametrize("num_groups, dispatcher", [(1, "index"), (3, "index"), (3, "one_hot"),
                                                  (1, "grouped"), (3, "grouped")])
def test_layer_matches_per_token_loop(stage1, capacity_factor, num_groups, dispatcher):
  cfg = moe_config(capacity_factor=capacity_factor, num_groups=num_groups, dispatcher=dispatcher)
  layer, params, x, ids = init_layer(cfg, tokens=24)
  got = layer.apply({"params": params}, x, ids, jnp.array(stage1), deterministic=False)
  capacity = {(2.0, 1): 12, (2.0, 3): 4, (0.75, 1): 5, (0.75, 3): 2}[capacity_factor, num_groups]  # ceil(cf * 24/G / 4)
  want = per_token_reference(params, np.asarray(x).reshape(24, D), np.asarray(ids).reshape(24), stage1, capacity,
                             num_groups)
  np.testing.assert_allclose(np.asarray(got).reshape(24, D), want, rtol=2e-4, atol=2e-4)


def test_capacity_overflow_passes_tokens_through():
  cfg = moe_config(capacity_factor=1.0)
  layer, params, x, ids = init_layer(cfg, tokens=16)
  # A huge centroid 0 along the all-ones direction and inputs pushed along it: every token picks expert 0.
  params["router"]["centroids"] = jnp.zeros((E, D)).at[0].set(10.0)
  x = jnp.abs(x) + 1.0
  out, sown = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False, mutable=[STATS])
  out, x = np.asarray(out).reshape(16, D), np.asarray(x).reshape(16, D)
  capacity = 4  # capacity factor 1: 16 tokens / 4 experts
  assert not np.allclose(out[:capacity], x[:capacity])  # the first four were served by expert 0
  np.testing.assert_array_equal(out[capacity:], x[capacity:])  # the other twelve passed through unchanged
  stats = layer_stats(sown)[""]
  assert float(stats.dropped_fraction) == pytest.approx(12 / 16)
  np.testing.assert_allclose(stats.load, [1.0, 0, 0, 0])


def test_stage2_routes_by_distilled_argmax_and_gates_with_original_centroids():
  router = StableMoERouter(num_experts=E, vocab_size=VOCAB, distill_dim=5)
  h = jax.random.normal(jax.random.key(0), (30, D))
  ids = jax.random.randint(jax.random.key(1), (30,), 0, VOCAB)
  params = randomized(jit_init(router, 2, h, ids, jnp.array(True))["params"])
  routing = router.apply({"params": params}, h, ids, jnp.array(False))
  table = params["distilled_router"]["embedding"] @ params["distilled_router"]["centroids"].T  # [V, E]
  want = np.argmax(np.asarray(table), axis=-1)[np.asarray(ids)]
  np.testing.assert_array_equal(routing.expert_index[:, 0], want)
  scores = np.asarray(h) @ np.asarray(params["centroids"]).T
  np.testing.assert_allclose(routing.gate[:, 0], 1 / (1 + np.exp(-scores[np.arange(30), want])), rtol=1e-5)
  # ... and stage 1 routes greedily on the original centroids.
  stage1 = router.apply({"params": params}, h, ids, jnp.array(True))
  np.testing.assert_array_equal(stage1.expert_index[:, 0], np.argmax(scores, axis=-1))


def test_balance_loss_hand_computed():
  # 4 tokens, 2 experts; greedy: tokens 0,1,2 -> expert 0, token 3 -> expert 1. Mean load 2.
  scores = jnp.array([[0.0, -1.0], [1.0, 0.0], [2.0, 1.0], [0.0, 3.0]])
  assignment = jnp.argmax(scores, -1)
  sig = lambda v: 1 / (1 + np.exp(-v))
  # expert 0: (3-2)/2 * (s(0)+s(1)+s(2)); expert 1: (1-2)/2 * s(3); times alpha, over 4 tokens.
  want = 0.3 * (0.5 * (sig(0.0) + sig(1.0) + sig(2.0)) - 0.5 * sig(3.0)) / 4
  assert float(stablemoe_balance_loss(scores, assignment, 0.3)) == pytest.approx(want, rel=1e-6)
  # 0.3 * (0.5 * (0.5 + 0.731059 + 0.880797) - 0.5 * 0.952574) / 4 = 0.043473
  assert want == pytest.approx(0.0434731, abs=1e-6)


def test_balance_loss_gradient_flows_through_sigmoids_only():
  scores = jnp.array([[0.0, -1.0], [1.0, 0.0], [2.0, 1.0], [0.0, 3.0]])
  grad = jax.grad(lambda s: stablemoe_balance_loss(s, jnp.argmax(s, -1), 0.3))(scores)
  sig = 1 / (1 + np.exp(-np.asarray(scores)))
  dsig = sig * (1 - sig)
  want = np.zeros((4, 2))
  want[[0, 1, 2], 0] = 0.3 * 0.5 * dsig[[0, 1, 2], 0] / 4
  want[3, 1] = -0.3 * 0.5 * dsig[3, 1] / 4
  np.testing.assert_allclose(grad, want, rtol=1e-5)


def test_distillation_loss_hand_computed_and_only_trains_the_distilled_router():
  router = StableMoERouter(num_experts=2, vocab_size=3, distill_dim=2, balance_alpha=0.0)
  h = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  ids = jnp.array([0, 2])
  params = jit_init(router, 0, h, ids, jnp.array(True))["params"]
  params = {
      "centroids": jnp.array([[1.0, 0.0], [0.0, 1.0]]),  # greedy: token 0 -> expert 0, token 1 -> expert 1
      "distilled_router": {"embedding": jnp.array([[1.0, 2.0], [0.0, 0.0], [3.0, -1.0]]),
                           "centroids": jnp.array([[1.0, 0.0], [0.0, 1.0]])},
  }
  # distilled logits: token 0 -> [1, 2], token 1 (id 2) -> [3, -1]; targets 0 and 1.
  want = 0.5 * ((np.log(np.exp(1) + np.exp(2)) - 1) + (np.log(np.exp(3) + np.exp(-1)) + 1))
  routing = router.apply({"params": params}, h, ids, jnp.array(True))
  assert float(routing.losses.distill) == pytest.approx(want, rel=1e-6)
  assert float(routing.stats.distill_accuracy) == 0.0  # distilled picks 1 then 0

  def distill_loss(params, h):
    return router.apply({"params": params}, h, ids, jnp.array(True)).losses.distill

  grad_params, grad_h = jax.grad(distill_loss, argnums=(0, 1))(params, h)
  assert np.all(np.asarray(grad_h) == 0) and np.all(np.asarray(grad_params["centroids"]) == 0)
  assert np.any(np.asarray(grad_params["distilled_router"]["embedding"]) != 0)
  # In stage 2 neither aux loss contributes.
  stage2 = router.apply({"params": params}, h, ids, jnp.array(False)).losses
  assert float(stage2.distill) == 0.0 and float(stage2.balance) == 0.0


@pytest.mark.parametrize("shuffle", [False, True])
def test_index_dispatch_matches_one_hot_reference_per_group(shuffle):
  groups, group_size, experts, capacity = 3, 20, 5, 3
  idx = jax.random.randint(jax.random.key(0), (groups, group_size), 0, experts)
  x = jax.random.normal(jax.random.key(1), (groups, group_size, 3))
  rng = jax.random.key(7) if shuffle else None
  slots = capacity_lib.group_slots(idx, experts, capacity, rng)
  buffers = jax.vmap(buffers_lib.scatter_to_buffers, in_axes=(0, 0, None, None))(x, slots, experts, capacity)
  # One-hot reference [G, T, E, C]: position = how many tokens before it, in the (shuffled) order, chose its expert.
  mask = np.zeros((groups, group_size, experts, capacity))
  for g in range(groups):
    order = np.asarray(jax.random.permutation(jax.random.fold_in(rng, g), group_size)) if shuffle else range(group_size)
    seen = np.zeros(experts, int)
    for t in order:
      e = int(idx[g, t])
      if seen[e] < capacity:
        mask[g, t, e, seen[e]] = 1
      seen[e] += 1
  np.testing.assert_allclose(buffers, np.einsum("gtec,gtd->gecd", mask, x), atol=1e-6)
  y = jax.random.normal(jax.random.key(2), (groups, experts, capacity, 3))
  np.testing.assert_allclose(jax.vmap(buffers_lib.gather_from_buffers)(y, slots), np.einsum("gtec,gecd->gtd", mask, y),
                             atol=1e-6)
  np.testing.assert_array_equal(slots < experts * capacity, mask.sum((2, 3)) == 1)


@pytest.mark.parametrize("placement, blocks_before, sublayers", [
    ("bottom", [0], 3), ("middle", [2], 3), ("top", [4], 3), ("scattered", [1, 2, 3], 1),
])
def test_moe_placement_puts_layers_between_the_right_blocks(placement, blocks_before, sublayers):
  from configs import default
  from stablemoe_jax.models.transformer import TransformerLM, moe_positions
  config = default.get_config().model
  config.vocab_size, config.d_model, config.num_heads, config.num_layers, config.d_ff = VOCAB, D, 2, 4, FF
  config.max_len, config.moe.num_experts, config.moe.sublayers_per_expert = 8, E, 3
  config.moe.placement = placement
  assert list(moe_positions(4, placement)) == blocks_before
  tokens = jnp.zeros((1, 8), jnp.int32)
  model = TransformerLM(typed(ModelSettings, config))
  params = model.init(jax.random.key(0), tokens, jnp.array(True))["params"]  # eager: keeps the call order
  moe_names = sorted(k for k in params if k.startswith("moe_"))
  assert moe_names == [f"moe_{i}" for i in range(len(blocks_before))]
  assert all(params[name]["experts"]["w_in"].value.shape[:2] == (E, sublayers) for name in moe_names)
  # Flax records submodules in call order: each MoE layer sits right after `blocks_before` blocks.
  order = [k for k in params if k.startswith(("moe_", "block_"))]
  for name, before in zip(moe_names, blocks_before):
    assert sum(k.startswith("block_") for k in order[: order.index(name)]) == before

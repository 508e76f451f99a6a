"""The top-k tests' tiny MoE config and their references by hand: the expert stacks and the Switch top-k layer
worked out per token in float64 numpy."""
import dataclasses
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tests.conftest import jit_init

from stablemoe_jax.core.settings import DistilledRouterSettings, MoESettings, typed
from stablemoe_jax.models.moe import make_moe_layer


D, FF, E, SUB, VOCAB = 8, 16, 4, 2, 11


def moe_config(router="switch", top_k=2, capacity_factor=2.0, num_groups=1, dispatcher="index", shared_experts=0,
               shuffle_tokens=False):
  return ml_collections.ConfigDict(dict(
      router=router, num_experts=E, capacity_factor=capacity_factor, eval_capacity_factor=capacity_factor, d_ff=FF,
      num_groups=num_groups, shuffle_tokens=shuffle_tokens, dispatcher=dispatcher, eval_dispatcher=dispatcher,
      shared_experts=shared_experts,
      switch=dict(balance_weight=0.01, z_loss_weight=0.0, jitter=0.0, fixed_routing=False, top_k=top_k),
      stablemoe=dict(balance_alpha=0.3, centroid_gain=0.1),
      hash=dict(table="random", seed=0),
      distilled_router={**dataclasses.asdict(DistilledRouterSettings()), "dim": 5},
  ))


def randomized(params, seed=1):
  """Every parameter replaced by N(0, 0.5) noise, so the zero-initialised output projections matter too."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def np_ffn_stack(ex, e, h):
  """What expert e's stack of SUB pre-LN ReLU sublayers adds to h (float64)."""
  y = h.copy()
  for s in range(SUB):
    z = (y - y.mean()) / np.sqrt(y.var() + 1e-5) * ex["ln_scale"][e, s] + ex["ln_bias"][e, s]
    z = np.maximum(z @ ex["w_in"][e, s] + ex["b_in"][e, s], 0.0) @ ex["w_out"][e, s] + ex["b_out"][e, s]
    y = y + z
  return y - h


def np_softmax(x):
  x = np.exp(x - x.max())
  return x / x.sum()


def hand_topk_layer(params, x, top_k, capacity, num_groups=1, shared=0):
  """Switch top-k by hand: softmax of h . E_i, the k most probable experts, their probabilities renormalised;
  capacity per (group, expert) filled by every token's first choice (in token order), then every second choice;
  out = h + sum of the kept choices' gated expert outputs + every shared expert's output."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  tokens = x.shape[0]
  group = tokens // num_groups
  choices, gates = [], []
  for t in range(tokens):
    probs = np_softmax(p["router"]["centroids"] @ x[t])
    ranked = sorted(range(E), key=lambda i: -probs[i])[:top_k]
    choices.append(ranked)
    gates.append([probs[i] / sum(probs[j] for j in ranked) for i in ranked])
  kept = np.zeros((tokens, top_k), bool)
  for g in range(num_groups):
    load = np.zeros(E, int)
    for j in range(top_k):  # all first choices before any second choice
      for t in range(g * group, (g + 1) * group):
        e = choices[t][j]
        if load[e] < capacity:
          load[e] += 1
          kept[t, j] = True
  out = np.array(x, np.float64)
  for t in range(tokens):
    for j in range(top_k):
      if kept[t, j]:
        out[t] += gates[t][j] * np_ffn_stack(p["experts"], choices[t][j], x[t])
    for i in range(shared):
      out[t] += np_ffn_stack(p["shared_experts"], i, x[t])
  return out, np.array(choices), np.array(gates), kept


def init_layer(cfg, tokens=24, seed=0):
  layer = make_moe_layer(typed(MoESettings, cfg), VOCAB, SUB, FF)
  x = jax.random.normal(jax.random.key(seed), (2, tokens // 2, D))
  ids = jax.random.randint(jax.random.key(seed + 1), (2, tokens // 2), 0, VOCAB)
  params = randomized(nn.unbox(jit_init(layer, 2, x, ids, jnp.array(True))["params"]))
  return layer, params, x, ids

"""The grouped dispatcher against ``index`` and a per-token loop; the gather's custom VJP; the eval path."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.models.test_moe import init_layer, moe_config, randomized

from configs import default
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.models import buffers as buffers_lib
from stablemoe_jax.models import capacity as capacity_lib
from stablemoe_jax.models import dispatch, experts
from stablemoe_jax.models import grouped_dispatch

E, S, D, FF = 4, 2, 8, 16


def expert_params(seed=0):
  params = nn.unbox(experts.FFNExperts(E, S, FF).init(jax.random.key(seed), D)["params"])
  return randomized(params, seed + 1)


def run(name, x, slots, params, capacity, rng=None, dropout=0.0, **kw):
  """x [G, Tg, D] through dispatcher ``name`` -> [G, Tg, D]."""
  fn = functools.partial(experts.apply_ffn_experts, dropout=dropout)
  return dispatch.DISPATCHERS[name](x, slots, params, rng, expert_fn=fn, num_experts=E, capacity=capacity, **kw)


def outputs_and_grads(name, x, slots, params, capacity, **kw):
  """Jitted: the dispatcher's output and the gradients of a loss on it w.r.t. params and x."""
  def both(params, x, slots):
    loss = lambda p, x: jnp.sum(jnp.sin(run(name, x, slots, p, capacity, **kw)) * jnp.arange(D))
    return run(name, x, slots, params, capacity, **kw), jax.grad(loss, argnums=(0, 1))(params, x)
  return jax.jit(both)(params, x, slots)


def assert_same_as_index(x, slots, params, capacity, **kw):
  out_i, (gpi, gxi) = outputs_and_grads("index", x, slots, params, capacity)
  out_g, (gpg, gxg) = outputs_and_grads("grouped", x, slots, params, capacity, **kw)
  np.testing.assert_allclose(out_g, out_i, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gxg, gxi, rtol=1e-5, atol=1e-5)
  for name in gpi:
    np.testing.assert_allclose(gpg[name], gpi[name], rtol=1e-4, atol=1e-5, err_msg=name)
  return out_g


def per_token_experts(params, x, expert_index, capacity):
  """The dispatcher's definition one token at a time in numpy: ``stack_e(x_t) - x_t`` if the token is among the
  first ``capacity`` of its group to choose its expert, else 0 (the loop counts for itself; slots are not used)."""
  p = jax.tree.map(np.asarray, params)
  group_size = np.asarray(expert_index).shape[1]
  x, expert_index = np.asarray(x).reshape(-1, D), np.asarray(expert_index).reshape(-1)
  out = np.zeros_like(x)
  for t, e in enumerate(expert_index):
    if t % group_size == 0:
      seen = np.zeros(E, int)  # a new routing group
    seen[e] += 1
    if seen[e] > capacity:
      continue  # dropped
    y = x[t].copy()
    for s in range(S):
      z = (y - y.mean()) / np.sqrt(y.var() + 1e-5) * p["ln_scale"][e, s] + p["ln_bias"][e, s]
      y = y + np.maximum(z @ p["w_in"][e, s] + p["b_in"][e, s], 0) @ p["w_out"][e, s] + p["b_out"][e, s]
    out[t] = y - x[t]
  return out


@pytest.mark.parametrize("groups, group_size, capacity_factor, block_size", [
    (3, 10, 1.0, 3), (1, 24, 1.0, 128), (3, 10, 0.0, 1), (3, 10, 0.0, 4), (2, 12, 2.0, 5)])
def test_grouped_equals_index_and_a_per_token_loop(groups, group_size, capacity_factor, block_size):
  params = expert_params()
  x = jax.random.normal(jax.random.key(1), (groups, group_size, D))
  expert_index = jax.random.randint(jax.random.key(2), (groups, group_size), 0, E)
  # ceil(cf * Tg / E) by hand: 3 (10 tokens, not divisible), 6, and no limit (cf 0)
  capacity = {1.0: -(-group_size // E), 2.0: -(-2 * group_size // E), 0.0: group_size}[capacity_factor]
  assert capacity_lib.expert_capacity(group_size, E, capacity_factor) == capacity
  slots = capacity_lib.group_slots(expert_index, E, capacity)
  if capacity_factor == 1.0:
    assert np.any(np.asarray(slots) == E * capacity)  # some tokens are dropped
  out = assert_same_as_index(x, slots, params, capacity, block_size=block_size)
  np.testing.assert_allclose(np.asarray(out).reshape(-1, D), per_token_experts(params, x, expert_index, capacity),
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["all_to_one_expert", "every_expert_b_plus_1"])
def test_worst_block_padding_is_still_exact(case):
  block = 4
  if case == "all_to_one_expert":
    expert_index = jnp.full((2, 9), 2, jnp.int32)
  else:  # E * (b + 1) tokens, b + 1 per expert: every expert needs a second, nearly empty block
    expert_index = jax.random.permutation(jax.random.key(3), jnp.repeat(jnp.arange(E), block + 1))[None]
  groups, group_size = expert_index.shape
  capacity = group_size  # nothing dropped
  slots = capacity_lib.group_slots(expert_index, E, capacity)
  row, block_expert = grouped_dispatch.grouped_rows(slots, E, capacity, block)
  used = np.asarray(block_expert)[np.asarray(block_expert) < E]
  want = [2] * 5 if case == "all_to_one_expert" else np.repeat(np.arange(E), 2)
  np.testing.assert_array_equal(used, want)
  assert len(np.unique(row)) == row.shape[0]  # one row per token
  x = jax.random.normal(jax.random.key(1), (groups, group_size, D))
  out = assert_same_as_index(x, slots, expert_params(), capacity, block_size=block)
  want = per_token_experts(expert_params(), x, expert_index, capacity)
  np.testing.assert_allclose(np.asarray(out).reshape(-1, D), want, rtol=1e-4, atol=1e-4)


def test_block_bound_is_tight_and_within_the_round_up_bound():
  for kept, experts_, block in [(4096, 8, 128), (20, 4, 4), (3, 8, 2), (1, 1, 1), (100, 7, 16)]:
    bound = grouped_dispatch.max_blocks(kept, experts_, block)
    assert bound * block <= -(-(kept + experts_ * (block - 1)) // block) * block
    busy = min(kept, experts_)  # one token on each busy expert but the first, the rest on the first
    counts = [kept - busy + 1] + [1] * (busy - 1)
    assert sum(-(-n // block) for n in counts) == bound


def test_gather_custom_vjp_gradient_equals_the_scatter_add_one():
  y = jax.random.normal(jax.random.key(0), (E, 3, D))
  slots = jnp.array([5, 12, 0, 3, 12, 11, 7], jnp.int32)  # 12 = E * C: dropped
  ct = jax.random.normal(jax.random.key(1), (7, D))
  plain = lambda y: jnp.concatenate([y.reshape(-1, D), jnp.zeros((1, D))])[slots]
  got = jax.grad(lambda y: jnp.sum(buffers_lib.gather_from_buffers(y, slots) * ct))(y)
  want = jax.grad(lambda y: jnp.sum(plain(y) * ct))(y)
  np.testing.assert_array_equal(buffers_lib.gather_from_buffers(y, slots), plain(y))
  np.testing.assert_allclose(got, want)
  assert np.all(np.asarray(got).reshape(-1, D)[[1, 2, 4, 6, 8, 9, 10]] == 0)  # empty slots: zero


def test_grouped_backward_has_no_scatter_add():
  params, x = expert_params(), jax.random.normal(jax.random.key(1), (1, 16, D))
  slots = capacity_lib.group_slots(jax.random.randint(jax.random.key(2), (1, 16), 0, E), E, 16)
  grad = jax.jit(jax.grad(lambda p, x: jnp.sum(run("grouped", x, slots, p, 16, block_size=4) ** 2), (0, 1)))
  scatters = grad.lower(params, x).as_text().split('stablehlo.scatter"')[1:]
  assert scatters  # the inverse maps token <-> row ...
  for scatter in scatters:  # ... are int32 scatters that set: no float scatter, no scatter-add
    region, _, signature = scatter.partition("}) : (")
    assert "add" not in region and signature.startswith("tensor<") and signature.split(",")[0].endswith("xi32>")


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_block_experts_custom_vjp_equals_autodiff_of_its_forward(dropout):
  params, blocks = expert_params(), jax.random.normal(jax.random.key(1), (5, 3, D))
  block_expert = jnp.array([1, 1, 3, 0, E], jnp.int32)  # the last block unused
  fn = functools.partial(experts.apply_ffn_experts, dropout=dropout)
  runner = grouped_dispatch._block_experts(fn, E)
  rng = jax.random.key(7) if dropout else None
  ct = jax.random.normal(jax.random.key(2), blocks.shape)
  loss = lambda f: lambda p, b: jnp.sum(f(p, b, block_expert, rng) * ct)
  got = jax.jit(jax.grad(loss(runner), (0, 1)))(params, blocks)
  want = jax.jit(jax.grad(loss(runner.fun), (0, 1)))(params, blocks)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  forward = jax.jit(lambda blocks: runner(params, blocks, block_expert, rng))
  out = forward(blocks)
  np.testing.assert_array_equal(out[-1], 0)  # the unused block
  if dropout:  # the masks depend on the block: a block's output changes with its place
    assert not np.allclose(forward(blocks[jnp.array([1, 0, 2, 3, 4])])[0], out[1])


@pytest.mark.parametrize("eval_capacity_factor", [0.0, 1.0])
def test_no_drop_evaluation_uses_grouped_and_equals_index(eval_capacity_factor, monkeypatch):
  calls = []
  grouped = grouped_dispatch.grouped_dispatch
  monkeypatch.setattr(dispatch, "grouped_dispatch", lambda *a, **k: calls.append(1) or grouped(*a, **k))
  outs = {}
  for eval_dispatcher in ("auto", "index", "grouped"):
    cfg = moe_config(eval_capacity_factor=eval_capacity_factor, num_groups=2)
    cfg.eval_dispatcher = eval_dispatcher
    layer, params, x, ids = init_layer(cfg, tokens=24)
    calls.clear()  # init runs the layer deterministically too
    outs[eval_dispatcher] = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=True)
    auto_grouped = eval_dispatcher == "auto" and eval_capacity_factor <= 0
    assert len(calls) == int(auto_grouped or eval_dispatcher == "grouped"), eval_dispatcher
  np.testing.assert_allclose(outs["grouped"], outs["index"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(outs["auto"], outs["index"], rtol=1e-5, atol=1e-5)


def test_dispatcher_names_resolve_by_mesh_and_drops():
  resolve = dispatch.resolve_dispatcher_name
  assert resolve("auto") == "index" and resolve("grouped") == "grouped"
  assert resolve("index", eval_name="auto", no_drops=True) == "grouped"  # the tests' backend: the CPU
  assert resolve("index", eval_name="auto", no_drops=True, backend="cpu") == "grouped"
  assert resolve("index", eval_name="auto", no_drops=True, backend="gpu") == "index"  # its block loop is slow there
  assert resolve("index", eval_name="auto", no_drops=False) == "index"
  assert resolve("grouped", eval_name="one_hot") == "one_hot"
  with pytest.raises(ValueError, match="unknown dispatcher 'nope'"):
    resolve("auto", eval_name="nope")


@pytest.mark.parametrize("key, value, expert, message", [
    ("block_size", 0, 1, "model.moe.block_size=0 must be positive"),
    ("eval_dispatcher", "fast", 1, "model.moe.eval_dispatcher='fast' is unknown"),
    ("dispatcher", "grouped", 2, "model.moe.dispatcher='grouped' has no expert parallelism, but mesh.expert=2"),
    ("eval_dispatcher", "grouped", 2, "model.moe.eval_dispatcher='grouped' has no expert parallelism"),
])
def test_bad_grouped_settings_are_one_clear_config_error(key, value, expert, message):
  config = default.get_config()
  config.model.moe[key] = value
  config.mesh.expert = expert
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


def test_default_grouped_settings_validate_with_an_expert_mesh():
  config = default.get_config()
  config.mesh.expert = 2  # eval_dispatcher auto then falls back to all_to_all
  validate_config(config)

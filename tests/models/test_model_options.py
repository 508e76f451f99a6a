"""model.attention, model.remat and bfloat16 compute: backend checks, equal gradients, float32 losses."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.conftest import jit_init

from configs import default
from stablemoe_jax.experiment.config_validation import ConfigError, check_backend, validate_config
from stablemoe_jax.experiment.step import token_nll
from stablemoe_jax.models.moe import SHUFFLE_RNG
from stablemoe_jax.models.routing import STATS, layer_stats
from stablemoe_jax.models.transformer import TransformerLM, attention_implementation
from stablemoe_jax.core.settings import ModelSettings, typed

BATCH, SEQ = 2, 16


def _config(**model):
  config = default.get_config()
  m = config.model
  m.vocab_size, m.d_model, m.num_heads, m.num_layers, m.d_ff, m.max_len, m.dropout = 200, 32, 2, 1, 64, SEQ, 0.1
  m.moe.num_experts, m.moe.d_ff, m.moe.sublayers_per_expert, m.moe.distilled_router.dim = 4, 32, 1, 8
  for key, value in model.items():
    m[key] = value
  config.train.batch_size, config.train.seq_len, config.eval.seq_len, config.analysis.sample_tokens = 4, SEQ, SEQ, SEQ
  return config


def _tokens():
  return jax.random.randint(jax.random.key(1), (BATCH, SEQ), 0, 200)


def _init(model):
  return jit_init(model, 0, jnp.zeros((1, SEQ), jnp.int32), jnp.array(True))["params"]


def test_attention_auto_is_xla_on_cpu_and_cudnn_fails_clearly_before_compiling():
  config = _config(dtype="bfloat16")
  assert attention_implementation(typed(ModelSettings, config.model)) == "xla"  # this test machine's backend is the CPU
  assert attention_implementation(typed(ModelSettings, config.model), backend="gpu") == "cudnn"
  # float32: cuDNN's kernel needs bf16
  assert attention_implementation(typed(ModelSettings, _config().model), backend="gpu") == "xla"
  config.model.attention = "cudnn"
  validate_config(config)  # the config alone is fine: it cannot know the machine
  with pytest.raises(ConfigError, match="needs an NVIDIA GPU, but JAX's backend is 'cpu'"):
    check_backend(config, jax.default_backend())
  with pytest.raises(ValueError, match="needs an NVIDIA GPU"):  # the model itself, at trace time
    jax.eval_shape(lambda: _init(TransformerLM(typed(ModelSettings, config.model))))
  with pytest.raises(ConfigError, match="bfloat16 or float16"):
    validate_config(_config(attention="cudnn"))
  with pytest.raises(ConfigError, match="model.attention='flash' is unknown"):
    validate_config(_config(attention="flash"))
  with pytest.raises(ConfigError, match="model.remat='all' is unknown"):
    validate_config(_config(remat="all"))


def _loss_and_grads(config, params):
  model = TransformerLM(typed(ModelSettings, config.model))
  tokens = _tokens()

  def loss_fn(params):
    rng = jax.random.key(3)
    output, sown = model.apply({"params": params}, tokens, jnp.array(True), deterministic=False,
                               rngs={"dropout": rng, SHUFFLE_RNG: jax.random.fold_in(rng, 1)},
                               mutable=[STATS])
    aux = sum(jax.tree.leaves([stats.losses for stats in layer_stats(sown).values()]))
    return jnp.mean(token_nll(output.logits(), jnp.roll(tokens, -1, axis=1))) + aux

  return jax.jit(jax.value_and_grad(loss_fn))(params)


@pytest.fixture(scope="module")
def without_remat():
  params = _init(TransformerLM(typed(ModelSettings, _config().model)))
  return params, *_loss_and_grads(_config(), params)


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["block", "block_dots_saveable"])
def test_remat_gives_the_same_loss_and_gradients(remat, without_remat):
  """With dropout and the token shuffle on: the recomputed forward must draw the same random bits."""
  params, loss, grads = without_remat
  loss_remat, grads_remat = _loss_and_grads(_config(remat=remat), params)
  assert jax.tree.structure(_init(TransformerLM(typed(ModelSettings, _config(remat=remat).model)))) == jax.tree.structure(params)
  np.testing.assert_allclose(loss_remat, loss, rtol=1e-6)
  for g, g_remat in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_remat)):
    np.testing.assert_allclose(g_remat, g, rtol=1e-5, atol=1e-7)


def test_bfloat16_model_keeps_float32_params_router_logits_logits_and_losses():
  config = _config(dtype="bfloat16")
  model = TransformerLM(typed(ModelSettings, config.model))
  params = _init(model)
  assert {x.dtype for x in jax.tree.leaves(nn.unbox(params))} == {jnp.dtype(jnp.float32)}
  rng = jax.random.key(3)
  apply = jax.jit(lambda params, tokens: model.apply(
      {"params": params}, tokens, jnp.array(True), deterministic=False, rngs={"dropout": rng, SHUFFLE_RNG: rng},
      mutable=[STATS, "intermediates"], capture_intermediates=True))
  output, state = apply(params, _tokens())
  logits = output.logits()
  assert output.hidden.dtype == jnp.bfloat16 and output.embedding.dtype == jnp.float32
  assert logits.dtype == jnp.float32
  inter = state["intermediates"]
  router = inter["moe_0"]["router"]
  # The router's gate is a sigmoid of its affinities s = h E^T: float32 only if the affinities are.
  assert router["__call__"][0].gate.dtype == jnp.float32
  assert router["distilled_router"]["__call__"][0].dtype == jnp.float32  # the distilled router's logits
  assert inter["block_0"]["__call__"][0].dtype == jnp.bfloat16  # the blocks do compute in bfloat16
  losses = jax.tree.leaves([stats.losses for stats in layer_stats(state).values()])
  assert losses and all(x.dtype == jnp.float32 for x in losses)
  assert token_nll(logits, _tokens()).dtype == jnp.float32


def test_checkpoints_restore_across_attention_and_remat_and_from_before_them():
  from stablemoe_jax.train import checkpoint

  old = _config().to_dict()
  del old["model"]["attention"], old["model"]["remat"]  # written before these keys existed
  new = _config(remat="block", attention="xla").to_dict()
  comparable = checkpoint._comparable  # pylint: disable=protected-access
  assert checkpoint._differences(comparable(old, True), comparable(new, True)) == []  # pylint: disable=protected-access

"""The paper's "stage 1 only" ablation (configs/ablate_cpu.py): a run whose stage 1 is the whole run is evaluated with
the routing it trained with, not with a distilled router it never switched to."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from configs import default
from stablemoe_jax.compare import methods
from stablemoe_jax.experiment.step import make_eval_step
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.tasks.lm import LanguageModelTask
from stablemoe_jax.core.settings import ModelSettings, typed


def _model_and_batch():
  config = default.get_config().model
  config.vocab_size, config.d_model, config.num_heads, config.num_layers, config.d_ff, config.max_len = (
      50, 16, 2, 2, 32, 16)
  config.dropout, config.moe.num_experts, config.moe.distilled_router.dim = 0.0, 4, 8
  model = TransformerLM(typed(ModelSettings, config))
  tokens = np.random.default_rng(0).integers(0, 50, (2, 16)).astype(np.int32)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), tokens, jnp.array(True))["params"])
  rng = np.random.default_rng(1)  # experts that do something, so that the routing shows in the loss
  params = jax.tree.map(lambda p: p + 0.3 * rng.standard_normal(p.shape).astype(np.float32), params)
  batch = {"inputs": tokens, "targets": np.roll(tokens, -1, axis=1), "weights": np.ones(tokens.shape, np.float32)}
  return model, params, batch


def _nll_sum(model, params, batch, in_stage1: bool) -> float:
  """The summed NLL by hand: log-softmax of the model's logits under the given routing, at the targets."""
  logits = jax.jit(model.apply, static_argnames="deterministic")({"params": params}, batch["inputs"],
                                                                  jnp.array(in_stage1), deterministic=True).logits()
  log_probs = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1))
  return float(-np.take_along_axis(log_probs, batch["targets"][..., None], axis=-1).sum())


def test_stage1_only_evaluates_with_the_learned_routing_and_the_default_with_the_distilled_one():
  model, params, batch = _model_and_batch()
  learned, distilled = _nll_sum(model, params, batch, True), _nll_sum(model, params, batch, False)
  assert abs(learned - distilled) > 1e-3  # the two routings differ on this batch
  for stage1_only, expected in ((True, learned), (False, distilled)):
    sums = jax.jit(make_eval_step(model, LanguageModelTask(), stage1_only=stage1_only))(params, batch)
    np.testing.assert_allclose(float(sums["nll_sum"]), expected, rtol=1e-5)


def test_the_stage1_only_method_sets_stage1_to_the_whole_budget_and_nothing_else():
  config = default.get_config()
  ablated = methods.apply_overrides(config, methods.METHODS["stablemoe_cosine_stage1_only"])
  assert ablated.train.stage1_steps == ablated.train.steps == config.train.steps
  assert ablated.train.learning_rate == config.train.learning_rate and ablated.model.moe.router == "stablemoe"

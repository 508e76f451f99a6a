"""The head's loss in chunks (``model.loss_chunk_tokens``) and the padded vocabulary (``model.vocab_multiple``).

References: the cross-entropy and its gradients written out in float64 numpy (softmax minus the smoothed labels),
and for the models the same step with both keys off (today's code path, bit for bit what it was).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests import conftest
from tests import mt_fixtures
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.experiment.step import make_eval_step
from stablemoe_jax.models import checks
from stablemoe_jax.models.head import HeadInputs, padded_vocab_size
from stablemoe_jax.models.seq2seq import TransformerSeq2Seq
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.tasks.lm import LanguageModelTask
from stablemoe_jax.tasks.translation import TranslationTask
from stablemoe_jax.train import losses
from stablemoe_jax.train.checkpoint import _comparable, _differences
from stablemoe_jax.core.settings import ModelSettings, from_config, typed

TOL = dict(rtol=2e-5, atol=2e-6)


def numpy_loss_and_grads(x, embedding, targets, weights, smoothing, vocab):
  """float64: mean weighted smoothed CE over the first ``vocab`` rows of ``embedding`` [Vp, d], and d/dx, d/dE."""
  x, e = np.asarray(x, np.float64), np.asarray(embedding, np.float64)
  z = x @ e[:vocab].T  # [T, V]
  z_max = z.max(-1, keepdims=True)
  log_p = z - z_max - np.log(np.exp(z - z_max).sum(-1, keepdims=True))
  labels = np.full(z.shape, smoothing / vocab)
  labels[np.arange(len(targets)), targets] += 1.0 - smoothing
  per_token = -(labels * log_p).sum(-1)
  norm = weights.sum()
  dz = (np.exp(log_p) - labels) * (weights / norm)[:, None]
  d_embedding = np.zeros_like(e)
  d_embedding[:vocab] = dz.T @ x
  return (per_token * weights).sum() / norm, per_token, dz @ e[:vocab], d_embedding


def _case(tokens=37, d=8, vocab=21, padded=21, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(tokens, d)).astype(np.float32)
  embedding = rng.normal(size=(padded, d)).astype(np.float32)
  embedding[vocab:] = 50.0  # padded rows that would win every softmax if they were scored
  targets = rng.integers(0, vocab, tokens).astype(np.int32)
  weights = (rng.random(tokens) > 0.3).astype(np.float32)  # some positions are padding
  return x, embedding, targets, weights


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk,padded", [(8, 21), (37, 21), (1000, 21), (5, 128)])
def test_chunked_loss_and_gradients_match_numpy(smoothing, chunk, padded):
  x, embedding, targets, weights = _case(padded=padded)

  def loss(x, embedding):
    head = HeadInputs(x, embedding, 21, chunk)
    per_token = losses.head_token_nll(head, jnp.asarray(targets), smoothing)
    return jnp.sum(per_token * weights) / weights.sum(), per_token

  (value, per_token), (dx, de) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, embedding)
  ref_value, ref_per_token, ref_dx, ref_de = numpy_loss_and_grads(x, embedding, targets, weights, smoothing, 21)
  np.testing.assert_allclose(per_token, ref_per_token, **TOL)
  np.testing.assert_allclose(value, ref_value, **TOL)
  np.testing.assert_allclose(dx, ref_dx, **TOL)
  np.testing.assert_allclose(de, ref_de, **TOL)
  assert not np.any(de[21:])  # no gradient reaches a padded row


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk,padded", [(8, 21), (1000, 21), (5, 128)])
def test_fused_mean_loss_and_gradients_match_numpy(smoothing, chunk, padded):
  """Training's loss: the gradients computed in the forward pass, scaled by the cotangent in the backward."""
  x, embedding, targets, weights = _case(padded=padded)
  loss = lambda x, e: 3.0 * losses.head_mean_loss(HeadInputs(x, e, 21, chunk), jnp.asarray(targets), weights,
                                                  smoothing)
  value, (dx, de) = jax.value_and_grad(loss, argnums=(0, 1))(x, embedding)
  ref_value, _, ref_dx, ref_de = numpy_loss_and_grads(x, embedding, targets, weights, smoothing, 21)
  np.testing.assert_allclose(value, 3.0 * ref_value, **TOL)
  np.testing.assert_allclose(dx, 3.0 * ref_dx, **TOL)
  np.testing.assert_allclose(de, 3.0 * ref_de, **TOL)
  assert not np.any(de[21:])


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_whole_logits_path_matches_numpy(smoothing):
  """The unchunked path (chunk_tokens 0: the whole logits), also with a padded embedding whose extra columns it
  cuts off; the per-token loss and training's mean loss."""
  x, embedding, targets, weights = _case(padded=32)
  assert HeadInputs(x, embedding, 21, 0).logits().shape == (37, 21)

  def loss(x, embedding):
    per_token = losses.head_token_nll(HeadInputs(x, embedding, 21, 0), jnp.asarray(targets), smoothing)
    return jnp.sum(per_token * weights) / weights.sum()

  mean_loss = lambda x, e: losses.head_mean_loss(HeadInputs(x, e, 21, 0), jnp.asarray(targets), weights, smoothing)
  ref_value, _, ref_dx, ref_de = numpy_loss_and_grads(x, embedding, targets, weights, smoothing, 21)
  for fn in (loss, mean_loss):
    value, (dx, de) = jax.value_and_grad(fn, argnums=(0, 1))(x, embedding)
    np.testing.assert_allclose(value, ref_value, **TOL)
    np.testing.assert_allclose(dx, ref_dx, **TOL)
    np.testing.assert_allclose(de, ref_de, **TOL)


def test_chunked_losses_in_bfloat16_keep_float32_gradients():
  x, embedding, targets, _ = _case(tokens=64, d=16, vocab=40, padded=40)
  _, _, _, ref_de = numpy_loss_and_grads(x, embedding, targets, np.ones(64), 0.0, 40)
  bf16 = lambda x, e: HeadInputs(x.astype(jnp.bfloat16), e, 40, 16)
  for loss in (lambda x, e: jnp.mean(losses.chunked_nll(bf16(x, e), jnp.asarray(targets))),
               lambda x, e: losses.head_mean_loss(bf16(x, e), jnp.asarray(targets), jnp.ones(64))):
    dx, de = jax.grad(loss, argnums=(0, 1))(x, embedding)
    assert de.dtype == jnp.float32 and dx.dtype == jnp.float32
    np.testing.assert_allclose(de, ref_de, rtol=0.05, atol=2e-3)  # bf16 inputs: bf16 tolerance


def test_padded_vocab_size():
  config = mt_fixtures.tiny_model_config(vocab_size=50257).model
  assert padded_vocab_size(typed(ModelSettings, config)) == 50257
  config.vocab_multiple = 128
  assert padded_vocab_size(typed(ModelSettings, config)) == 50304
  config.vocab_multiple, config.vocab_size = 128, 256
  assert padded_vocab_size(typed(ModelSettings, config)) == 256


def test_new_keys_are_validated():
  config = conftest.make_tiny_config("")
  config.model.vocab_size = 100
  checks.check_model(typed(ModelSettings, config.model))
  for key, value in (("loss_chunk_tokens", -1), ("vocab_multiple", -128)):  # ConfigDict keeps them ints
    bad = conftest.make_tiny_config("")
    bad.model[key] = value
    with pytest.raises(ConfigError, match=f"model.{key}"):
      checks.check_model(typed(ModelSettings, bad.model))


def test_checkpoint_comparison_of_the_new_keys():
  """An old checkpoint's config (neither key) restores with both off, under any chunking, and wherever the
  multiple pads nothing; with padding that adds rows it is named as a difference."""
  old = conftest.make_tiny_config("").to_dict()
  old["model"]["vocab_size"] = 10000
  del old["model"]["loss_chunk_tokens"], old["model"]["vocab_multiple"]
  new = conftest.make_tiny_config("").to_dict()
  new["model"]["vocab_size"] = 10000
  new["model"]["loss_chunk_tokens"] = 512
  assert _differences(_comparable(old, True), _comparable(new, True)) == []
  new["model"]["vocab_multiple"] = 16  # 10,000 is a multiple of 16: the same embedding
  assert _differences(_comparable(old, True), _comparable(new, True)) == []
  new["model"]["vocab_multiple"] = 128
  assert _differences(_comparable(old, True), _comparable(new, True)) == [
      "model.padded_vocab_size: checkpoint '<absent>', this config 10112"]


# The models: both keys on against both off, the same parameters (the padded model's first V rows).

def _lm_setup(vocab_multiple=0, chunk=0, vocab=50):
  config = conftest.make_tiny_config("")
  config.model.vocab_size = vocab
  config.model.dropout = 0.0
  config.model.loss_chunk_tokens, config.model.vocab_multiple = chunk, vocab_multiple
  return config, TransformerLM(typed(ModelSettings, config.model))


def _pad_params(params, padded, value=30.0):
  """``params`` with ``embed/embedding`` padded to ``padded`` rows of ``value`` (large: they would win if scored)."""
  params = jax.tree.map(lambda a: a, params)
  e = params["embed"]["embedding"]
  params["embed"]["embedding"] = jnp.concatenate([e, jnp.full((padded - e.shape[0], e.shape[1]), value, e.dtype)])
  return params


def _lm_batch(rows=4, seq=16, vocab=50, seed=1):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (rows, seq + 1)).astype(np.int32)
  weights = np.ones((rows, seq), np.float32)
  weights[-1, 9:] = 0.0
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights}


def _assert_the_same_training_and_evaluation(model, on_model, task, params, on_params, batch, chunk, vocab):
  """``on_model`` (keys on; ``on_params``: ``params`` padded) against ``model`` (keys off): loss, gradients, sums."""
  assert (model.config.loss_chunk_tokens, on_model.config.loss_chunk_tokens) == (0, chunk)
  ref_loss, ref_grads = _loss_and_grads(model, task, params, batch)
  loss, grads = _loss_and_grads(on_model, task, on_params, batch)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  assert not np.any(grads["embed"]["embedding"][vocab:])
  grads["embed"]["embedding"] = grads["embed"]["embedding"][:vocab]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grads, ref_grads)
  ref_sums = jax.jit(make_eval_step(model, task))(params, batch)
  sums = jax.jit(make_eval_step(on_model, task))(on_params, batch)
  np.testing.assert_allclose(sums["nll_sum"], ref_sums["nll_sum"], rtol=1e-6)
  assert float(sums["tokens"]) == float(ref_sums["tokens"]) == batch["weights"].sum()


def _loss_and_grads(model, task, params, batch):
  """The task's training loss of the model's output (whole logits or in chunks, as the model's config says)."""
  def loss(params):
    out = model.apply({"params": params}, *task.model_inputs(batch), jnp.array(False), deterministic=True)
    return task.train_loss(out, batch)
  return jax.jit(jax.value_and_grad(loss))(params)


def test_lm_init_with_padding_is_the_unpadded_init_plus_zero_rows():
  config, model = _lm_setup()
  padded_config, padded_model = _lm_setup(vocab_multiple=64)
  tokens = jnp.zeros((1, 16), jnp.int32)
  plain, padded = (conftest.jit_init(m, 0, tokens, jnp.array(True))["params"] for m in (model, padded_model))
  np.testing.assert_array_equal(padded["embed"]["embedding"][:50], plain["embed"]["embedding"])
  np.testing.assert_array_equal(padded["embed"]["embedding"][50:], 0.0)
  assert padded["embed"]["embedding"].shape == (64, 32)


@pytest.mark.parametrize("chunk,multiple", [(16, 0), pytest.param(24, 64, marks=pytest.mark.slow)])  # slow: ~25 s
def test_lm_loss_gradients_and_eval_sums_with_the_keys_on(chunk, multiple):
  config, model = _lm_setup()
  params = conftest.jit_init(model, 0, jnp.zeros((1, 16), jnp.int32), jnp.array(True))["params"]
  batch, task = _lm_batch(), LanguageModelTask()
  assert batch["weights"].sum() == 4 * 16 - 7
  on_config, on_model = _lm_setup(multiple, chunk)
  on_params = _pad_params(params, padded_vocab_size(typed(ModelSettings, on_config.model))) if multiple else params
  _assert_the_same_training_and_evaluation(model, on_model, task, params, on_params, batch, chunk, 50)
  if multiple:  # the logits the models return (analysis, decoding) have V columns; argmax is never a padded id
    logits = on_model.apply({"params": on_params}, batch["inputs"], jnp.array(False)).logits()
    assert logits.shape[-1] == 50 and int(jnp.argmax(logits, -1).max()) < 50


def _mt_batch(rows=4, length=12, vocab=40, seed=2):
  rng = np.random.default_rng(seed)
  source = rng.integers(4, vocab, (rows, length)).astype(np.int32)
  source[1, 7:] = 0  # padding
  targets = rng.integers(4, vocab, (rows, length)).astype(np.int32)
  weights = np.ones((rows, length), np.float32)
  weights[0, 5:] = 0.0
  weights[2, 9:] = 0.0
  targets[weights == 0] = 0
  decoder_inputs = np.concatenate([np.full((rows, 1), 1, np.int32), targets[:, :-1]], axis=1)
  return {"source": source, "decoder_inputs": decoder_inputs, "targets": targets, "weights": weights}


@pytest.mark.parametrize("chunk,multiple", [pytest.param(5, 128, marks=pytest.mark.slow),  # ~30 s each
                                            pytest.param(0, 64, marks=pytest.mark.slow)])
def test_translation_smoothed_loss_gradients_and_eval_sums_with_the_keys_on(chunk, multiple):
  config = mt_fixtures.tiny_model_config(vocab_size=40)
  config.train.label_smoothing = 0.1
  model, task = TransformerSeq2Seq(typed(ModelSettings, config.model)), TranslationTask(from_config(config))
  row = jnp.zeros((1, 12), jnp.int32)
  params = conftest.jit_init(model, 0, row, row, jnp.array(True))["params"]
  on_config = ml_collections.ConfigDict(config.model.to_dict())  # the reference model keeps its own
  on_config.loss_chunk_tokens, on_config.vocab_multiple = chunk, multiple
  on_model = TransformerSeq2Seq(typed(ModelSettings, on_config))
  on_params = _pad_params(params, padded_vocab_size(typed(ModelSettings, on_config))) if multiple else params
  _assert_the_same_training_and_evaluation(model, on_model, task, params, on_params, _mt_batch(), chunk, 40)


@pytest.mark.slow  # ~22 s on the shared cores: greedy and beam compiled
def test_greedy_and_beam_decoding_never_emit_a_padded_id():
  from stablemoe_jax.decoding.translator import make_translate_fn
  config = mt_fixtures.tiny_model_config(vocab_size=40)
  config.model.vocab_multiple = 64
  model = TransformerSeq2Seq(typed(ModelSettings, config.model))
  row = jnp.zeros((1, 12), jnp.int32)
  params = conftest.jit_init(model, 0, row, row, jnp.array(True))["params"]
  params = jax.tree.map(lambda a: a, params)
  params["embed"]["embedding"] = params["embed"]["embedding"].at[40:].set(30.0)
  source = _mt_batch()["source"]
  for beam in (1, 2):
    tokens, _ = make_translate_fn(typed(ModelSettings, config.model), beam, 8)(params, source)
    assert int(np.max(tokens)) < 40


def test_flops_count_the_padded_head():
  """models/flops.py reads the embedding's shape: the padded head computes (and is counted as) 2 Vp d a token."""
  from stablemoe_jax.models import flops
  shapes = {}
  for multiple in (0, 128):
    _, model = _lm_setup(multiple, vocab=1000)
    shapes[multiple] = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32),
                                                         jnp.array(True)))["params"]
  assert shapes[128]["embed"]["embedding"].shape == (1024, 32)
  extra = flops.forward_flops_per_token(shapes[128], 16) - flops.forward_flops_per_token(shapes[0], 16)
  assert extra == 2 * (1024 - 1000) * 32

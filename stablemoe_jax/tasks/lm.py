"""Language modelling: a decoder-only Transformer over one token stream, scored by perplexity."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.data.lm import eval_sets
from stablemoe_jax.data.lm import pipeline as data_lib
from stablemoe_jax.data.lm.token_counts import split_token_counts
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.train.losses import head_mean_loss, head_token_nll


class LanguageModelTask:
  """``config.task = "lm"``: batches ``{inputs, targets, weights}`` [B, S] of ``data_lib.LMData``."""

  name = "lm"

  def load_data(self, data: settings_lib.LMDataSettings, prepared_dir):
    return data_lib.load_lm_data(data, prepared_dir)

  def build_model(self, model: settings_lib.ModelSettings):
    return TransformerLM(model)

  def sample_inputs(self, settings):
    return (jnp.zeros((1, settings.train.seq_len), jnp.int32),)

  def batch_shapes(self, rows, seq_len):
    shape = (rows, seq_len)
    return {"inputs": jax.ShapeDtypeStruct(shape, jnp.int32), "targets": jax.ShapeDtypeStruct(shape, jnp.int32),
            "weights": jax.ShapeDtypeStruct(shape, jnp.float32)}

  def model_inputs(self, batch):
    return (batch["inputs"],)

  def model_keywords(self, batch):
    return {}

  def train_loss(self, output, batch) -> jax.Array:
    return head_mean_loss(output, batch["targets"], batch["weights"])

  def eval_sums(self, output, batch):
    weights = batch["weights"]
    return {"nll_sum": jnp.sum(head_token_nll(output, batch["targets"]) * weights), "tokens": weights.sum()}

  def train_iterator(self, data, settings, shard_index: int, shard_count: int):
    train = settings.train
    return data.train_iterator(train.batch_size, train.seq_len, settings.seed,
                               shard_index=shard_index, shard_count=shard_count)

  def eval_batches(self, data, settings, split: str, stride: int = 0):
    return data.eval_batches(split, settings.eval.batch_size, settings.eval.seq_len, stride=stride)

  def routing_sample(self, data, settings, rows: int):
    sample = next(data.eval_batches("valid", rows, settings.train.seq_len))
    if sample["weights"].min() < 1:
      raise ConfigError(
          f"analysis.sample_tokens={settings.analysis.sample_tokens} exceeds the validation split "
          f"({data.split_num_tokens('valid') - 1} predictions); lower --config.analysis.sample_tokens.")
    return sample

  def routing_tokens(self, layer, batch):
    del layer  # every layer routes the input tokens
    return np.asarray(batch["inputs"]), np.asarray(batch["weights"]) > 0

  def train_token_counts(self, data, vocab_size: int) -> np.ndarray:
    return split_token_counts(data, vocab_size)

  def eval_description(self, settings) -> dict:
    """Non-overlapping blocks or sliding windows (``eval.stride``)."""
    cfg = settings.eval
    stride = cfg.stride
    sliding = 0 < stride < cfg.seq_len
    return {"mode": "sliding" if sliding else "blocks", "seq_len": cfg.seq_len,
            "stride": stride if sliding else cfg.seq_len}

  def final_report(self, run: RunView, params, split: str = "test") -> dict:
    """``{"sets": {name: {"valid": {loss, perplexity, tokens}, "test": {...}}}}``: each of ``data.eval_sets``' sets
    scored on its own as ``evaluate`` scores a split (both held-out splits whatever ``split`` is: they are small);
    {} without sets."""
    del split  # every set's valid and test are reported
    sets = eval_sets.parse(run.settings.data)
    if not sets:
      return {}
    batches = run.final_eval_batches
    return {"sets": {name: {held_out: run.evaluate(params, eval_sets.split_name(held_out, name), batches)
                            for held_out in eval_sets.SPLITS} for name in sets}}

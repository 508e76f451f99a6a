"""The task interface: what the shared loop, steps and checkpoints need to know about a task.

A task says which data a run prepares, which model it builds, which batch entries feed that model, how
its output (the head's inputs) is scored in training and evaluation, and what its final report adds.
Everything else (the train and eval steps, optimizer, mesh, checkpoints, exact resume, metrics, routing
records) is the same code for every task. Batches are dicts of numpy arrays whose leading axis is rows ([B, ...]).
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol

import flax.linen as nn
import jax
import numpy as np

from stablemoe_jax.core.run_view import RunView
from stablemoe_jax.core.settings import LMDataSettings, ModelSettings, RunSettings, TranslationDataSettings

Batch = dict[str, Any]


class Task(Protocol):
  """One task (``config.task``); the model it builds is called as ``model(*model_inputs(batch), in_stage1, det)``.

  The methods that read the run's sections take its typed settings (``RunSettings``, ``Experiment.settings``)."""

  name: str

  def load_data(self, data: LMDataSettings | TranslationDataSettings, prepared_dir) -> Any:
    """Prepares (or reuses) the tokenizer and records of ``data`` (the task's typed data settings,
    ``RunSettings.data``) under ``prepared_dir``; returns the data object.

    The object has ``vocab_size`` and ``tokenizer``.
    """

  def build_model(self, model: ModelSettings) -> nn.Module:
    """The Flax module of the task's model, built from the typed ``model`` settings."""

  def sample_inputs(self, settings: RunSettings) -> tuple[jax.Array, ...]:
    """Arguments before ``in_stage1`` with which ``model.init`` creates the parameters (one row)."""

  def batch_shapes(self, rows: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The entries of a training batch of ``rows`` rows and their shapes (``--mode=plan`` compiles with them)."""

  def model_inputs(self, batch: Batch) -> tuple[jax.Array, ...]:
    """The batch entries the model is called with, before ``in_stage1``."""

  def model_keywords(self, batch: Batch) -> dict[str, jax.Array]:
    """Batch entries the model takes by keyword, if the batch has them (translation: packed rows' segments)."""

  def train_loss(self, output: Any, batch: Batch) -> jax.Array:
    """float32 scalar: the loss training minimises (before the MoE layers' auxiliary losses), of the model's
    output (the models': ``models/head.HeadInputs``, to which the loss applies the head)."""

  def eval_sums(self, output: Any, batch: Batch) -> dict[str, jax.Array]:
    """``{"nll_sum", "tokens"}``: summed NLL of the batch's scored tokens (from the model's output) and their
    count."""

  def train_iterator(self, data, settings: RunSettings, shard_index: int, shard_count: int) -> Any:
    """Endless training batches of this process's rows, with ``get_state`` / ``set_state`` (exact resume)."""

  def eval_batches(self, data, settings: RunSettings, split: str, stride: int = 0) -> Iterator[Batch]:
    """Whole evaluation batches of ``split`` (every process reads the same), each of ``eval.batch_size`` rows."""

  def routing_sample(self, data, settings: RunSettings, rows: int) -> Batch:
    """The fixed validation sample the routing records route: a batch of ``rows`` rows of ``train.seq_len``."""

  def routing_tokens(self, layer: str, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [B, S] ids, bool [B, S] real tokens) of the positions MoE layer ``layer`` routes in ``batch``."""

  def train_token_counts(self, data, vocab_size: int) -> np.ndarray:
    """int64 [vocab_size]: how often each id occurs where the routers read ids in training."""

  def eval_description(self, settings: RunSettings) -> dict:
    """How evaluation scores a split (``summary.json["eval"]``)."""

  def final_report(self, run: RunView, params, split: str = "test") -> dict:
    """Entries the task adds to ``summary.json`` after training and to ``--mode=eval``'s result on ``split``
    (the language model: none; translation: BLEU)."""

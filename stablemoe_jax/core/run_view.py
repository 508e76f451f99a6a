"""What the routing analyses, the facts probe and a task's final report read of a built run, as typed fields.

``experiment/loop.Experiment.view()`` makes it; the readers below the runners (``analysis/``, ``tasks/``) take it in
place of the whole experiment, so what each reads is named here: the run's config (as recorded, and typed), its
folder, task, data, mesh, model, the parameters' shardings and its evaluation.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, Iterator, Protocol

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from stablemoe_jax.core.settings import ModelSettings, RunSettings


class RoutedTask(Protocol):
  """The part of a task (``tasks/base.Task``) that the analyses call: its model, inputs, batches and routed ids."""

  def build_model(self, model: ModelSettings) -> nn.Module: ...

  def model_inputs(self, batch: dict) -> tuple[jax.Array, ...]: ...

  def eval_batches(self, data, settings: RunSettings, split: str, stride: int = 0) -> Iterator[dict]: ...

  def routing_sample(self, data, settings: RunSettings, rows: int) -> dict: ...

  def routing_tokens(self, layer: str, batch: dict) -> tuple[np.ndarray, np.ndarray]: ...


@dataclasses.dataclass(frozen=True)
class RunView:
  """A built run, as its readers below the runners see it.

  ``evaluate(params, split, max_batches)`` -> ``{"loss", "perplexity", "tokens", "batches"}``: the run's evaluation
  with the inference routing (``max_batches > 0``: a prefix); ``final_eval_batches``: the final evaluations'
  batches per split (``eval.max_batches``; 0: the whole split).
  """

  config: ml_collections.ConfigDict  # the resolved config the run records (model.vocab_size set)
  settings: RunSettings  # the same, typed
  workdir: pathlib.Path
  task: RoutedTask
  data: Any  # the task's data (``load_data``'s: ``LMData``, ``TranslationData``, ``FactsData``)
  mesh: jax.sharding.Mesh
  model: nn.Module
  param_shardings: Any  # the parameters' pytree of shardings on ``mesh``
  evaluate: Callable[[Any, str, int], dict]
  final_eval_batches: int

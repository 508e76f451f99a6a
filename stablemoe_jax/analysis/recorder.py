"""The train loop's hook: routing records every ``analysis.record_every`` steps, the report at the end."""
from __future__ import annotations

import jax
import numpy as np

from stablemoe_jax.analysis import records as records_lib
from stablemoe_jax.analysis.report import global_inputs, write_report
from stablemoe_jax.analysis.routes import analysis_model, make_sample_router, stack_layers
from stablemoe_jax.core.errors import require
from stablemoe_jax.core.run_view import RunView
from stablemoe_jax.core.settings import RunSettings
from stablemoe_jax.models.transformer import has_moe_layers
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.parallel import sharding as sharding_lib


class RoutingRecorder:
  """Records, at steps 0, every ``record_every`` and the last, each MoE layer's expert for every token of a
  fixed validation sample under the training routing of that step and the inference routing (top-k routing:
  every one of its k choices, ``records.write_record``).

  Created after the state is restored: it drops records past ``start_step`` (the interrupted run wrote
  them after its last checkpoint; this run rewrites them identically). Every process must make the same
  calls (the routing pass is a collective); only the chief writes.

  Args:
    run: the run's config, folder, task, data, mesh and parameter shardings.
    start_step: the step the run starts (or resumes) from.
  """

  def __init__(self, run: RunView, start_step: int):
    cfg = run.settings
    self._run = run
    self._every = cfg.analysis.record_every
    self._steps, self._stage1_steps = cfg.train.steps, cfg.train.stage1_steps
    self._num_experts = cfg.model.moe.num_experts
    self.enabled = has_moe_layers(cfg.model) and self._every > 0
    self._directory = records_lib.records_dir(run.workdir)
    self._is_chief = jax.process_index() == 0
    self._meta_written = False
    if not self.enabled:
      return
    check_devices(cfg, run.mesh.size)  # made before anything is prepared too (config_validation); kept for callers
    rows = cfg.analysis.sample_tokens // cfg.train.seq_len
    self._sample = run.task.routing_sample(run.data, run.settings, rows)  # numpy [R, S] entries, the same on every process
    self._inputs = global_inputs(run, self._sample)
    self._route = mesh_lib.under_mesh(run.mesh, jax.jit(
        make_sample_router(analysis_model(run.task, run.settings.model), cfg.seed, choices=True), static_argnums=2,
        in_shardings=(run.param_shardings, sharding_lib.batch_sharding(run.mesh)),
        out_shardings=sharding_lib.replicated(run.mesh)))
    if self._is_chief:
      records_lib.drop_records_after(self._directory, start_step)

  def _is_record_step(self, step: int) -> bool:
    return step % self._every == 0 or step == self._steps

  def record(self, params, step: int) -> None:
    """Routes the sample with ``params`` (after ``step`` updates) and writes the record of ``step``."""
    train, inference = self._route(params, self._inputs, step < self._stage1_steps)
    layers, train = stack_layers(train)
    _, inference = stack_layers(inference)
    if not self._is_chief:
      return
    if not self._meta_written:
      tokens, masks = zip(*(self._run.task.routing_tokens(layer, self._sample) for layer in layers))
      meta = {"layers": layers, "num_experts": self._num_experts, "steps": self._steps,
              "stage1_steps": self._stage1_steps, "record_every": self._every,
              "router": self._run.settings.model.moe.router, "sample_shape": list(tokens[0].shape)}
      records_lib.write_meta(self._directory, meta, np.stack([t.reshape(-1) for t in tokens]),
                             np.stack([m.reshape(-1) for m in masks]))
      self._meta_written = True
    records_lib.write_record(self._directory, step, train, inference, self._num_experts)

  def after_step(self, state, step: int) -> None:
    """Call with the state after update ``step`` (and once with the start state, step 0 or the resumed one)."""
    if self.enabled and self._is_record_step(step):
      self.record(state.params, step)

  def finish(self, state, step: int) -> dict | None:
    """At the end of training: the cohesion, load and fluctuation files of the final state (analysis.report_at_end)."""
    cfg = self._run.settings
    if not (has_moe_layers(cfg.model) and cfg.analysis.report_at_end):
      return None
    return write_report(self._run, state.params, "valid", step)


def check_config(run: RunSettings) -> None:
  """The ``analysis`` section (routing records and their report)."""
  analysis, train = run.analysis, run.train
  require(analysis.record_every >= 0, f"analysis.record_every={analysis.record_every} must be >= 0 (0: no records).")
  require(analysis.sample_tokens >= train.seq_len,
          f"analysis.sample_tokens={analysis.sample_tokens} must be at least train.seq_len={train.seq_len} "
          f"(the sample is whole rows of train.seq_len tokens); raise --config.analysis.sample_tokens.")
  require(analysis.top_tokens > 0, f"analysis.top_tokens={analysis.top_tokens} must be positive.")


def check_devices(run: RunSettings, device_count: int) -> None:
  """What the routing records ask of a launch on ``device_count`` devices (``model.moe.num_groups`` resolved): the
  sample's R = ``analysis.sample_tokens // train.seq_len`` rows are split over the devices, and its R x seq_len
  tokens routed in the model's groups."""
  if not (has_moe_layers(run.model) and run.analysis.record_every > 0):
    return
  seq_len, tokens = run.train.seq_len, run.analysis.sample_tokens
  rows = tokens // seq_len
  require(rows % device_count == 0,
          f"analysis.sample_tokens // train.seq_len (= {tokens} // {seq_len} = {rows} rows of the routing sample) "
          f"must be a multiple of the number of devices ({device_count}); set --config.analysis.sample_tokens to a "
          f"multiple of {device_count * seq_len} (or --config.analysis.record_every=0: no routing records).")
  groups = run.model.moe.num_groups
  require(groups > 0 and rows * seq_len % groups == 0,
          f"model.moe.num_groups={groups} must divide the {rows * seq_len} tokens of the routing sample "
          f"({rows} rows of train.seq_len={seq_len}); change --config.analysis.sample_tokens.")

"""The training and evaluation loops: data -> jitted step -> metrics and checkpoints."""
from __future__ import annotations

import math
import pathlib
from typing import Iterable

import jax
import ml_collections
import numpy as np
import tqdm

from stablemoe_jax import tasks as tasks_lib
from stablemoe_jax.analysis.contribution import experiment_contributions
from stablemoe_jax.analysis.facts_probe import FactsProbe
from stablemoe_jax.analysis.recorder import RoutingRecorder
from stablemoe_jax.experiment import actions
from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.errors import CheckpointMismatchError
from stablemoe_jax.core.run_view import RunView
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.experiment import plan as plan_lib
from stablemoe_jax.experiment.clock import TrainClock
from stablemoe_jax.experiment.config_validation import check_backend, check_prepared, validate_config
from stablemoe_jax.experiment.step import jit_train_step, make_eval_step, make_routing_agreement_step
from stablemoe_jax.models import routers
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.parallel import sharding as sharding_lib
from stablemoe_jax.train import checkpoint as ckpt_lib
from stablemoe_jax.train import health as health_lib
from stablemoe_jax.train.metrics import MetricWriter, last_logged, read_metrics
from stablemoe_jax.train.optimizer import make_optimizer
from stablemoe_jax.train.state import TrainState, create_train_state, train_state_shardings


class Experiment:
  """Everything a run builds from its config: task, data, model, optimizer, steps, checkpointer.

  Building it validates the config and prepares the data, but compiles nothing. What differs between
  tasks (data, model, loss, evaluation) comes from ``self.task`` (``config.task``, ``tasks/base.py``).
  Every config check, the layout's included, comes before anything is written or prepared; the automatic
  ``model.moe.num_groups = 0`` becomes the number the run's checkpoints recorded (a resumption or an evaluation
  on another layout routes as training did), else one group per device, and ``self.config`` holds it (saved in
  ``workdir/config.json`` and with every checkpoint).
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | pathlib.Path):
    self.workdir = pathlib.Path(workdir)
    recorded = ckpt_lib.saved_num_groups(self.workdir / "checkpoints")
    config = mesh_lib.resolve_layout(config, jax.device_count(), recorded)
    validate_config(config, device_count=jax.device_count())
    check_backend(config, jax.default_backend())
    check_prepared(config, self.workdir)  # a corpus only `stablemoe_jax.prepare` prepares: one line naming it
    if jax.default_backend() == "cpu":  # every CPU device's state lies in this host's memory
      plan_lib.check_host_memory(config, jax.device_count(), jax.local_device_count(), plan_lib.host_memory_available())
    self.workdir.mkdir(parents=True, exist_ok=True)
    self.mesh = mesh_lib.make_mesh(config.mesh)
    before_vocab = settings_lib.from_config(config)  # typed; model.vocab_size is set from the data below
    self.task = tasks_lib.make_task(before_vocab)
    data_settings = before_vocab.data
    if jax.process_index() == 0:  # prepares tokenizer and records once; the others then read them
      self.data = self.task.load_data(data_settings, self.workdir / "data")
    mesh_lib.barrier("data prepared")
    if jax.process_index() != 0:
      self.data = self.task.load_data(data_settings, self.workdir / "data")
    validate_config(config, data_vocab_size=self.data.vocab_size)
    self.config = config = ml_collections.ConfigDict(config.to_dict())
    if not config.model.vocab_size:
      config.model.vocab_size = self.data.vocab_size
    self.settings = settings_lib.from_config(config)  # typed; self.config stays what is recorded
    if jax.process_index() == 0:
      (self.workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    self.model = self.task.build_model(self.settings.model)
    self.sample_inputs = self.task.sample_inputs(self.settings)
    self.tx = make_optimizer(self.settings.train)
    self.checkpointer = ckpt_lib.Checkpointer(
        self.workdir / "checkpoints", config, keep=config.train.keep_checkpoints
    )
    self.state_shardings = train_state_shardings(self.model, self.tx, config.train.seq_len, self.mesh,
                                                 self.sample_inputs)
    batch_sharding = sharding_lib.batch_sharding(self.mesh)
    self.eval_step = mesh_lib.under_mesh(self.mesh, jax.jit(
        make_eval_step(self.model, self.task, stage1_only=config.train.stage1_steps >= config.train.steps),
        in_shardings=(self.state_shardings.params, batch_sharding),
        out_shardings=sharding_lib.replicated(self.mesh)))

    self.routing_agreement_step = mesh_lib.under_mesh(
        self.mesh, jax.jit(make_routing_agreement_step(self.model, self.task)))

  def view(self) -> RunView:
    """What the analyses, the facts probe and the task's final report read of this run (``core/run_view.py``)."""
    return RunView(config=self.config, settings=self.settings, workdir=self.workdir, task=self.task, data=self.data,
                   mesh=self.mesh, model=self.model, param_shardings=self.state_shardings.params,
                   evaluate=self.evaluate, final_eval_batches=self.final_eval_batches)

  def init_state(self) -> TrainState:
    """A fresh state laid out over the mesh (expert parameters split over ``expert``, the rest replicated).

    Routers built from the training data (the balanced hash table) get their tables here.
    """
    state = create_train_state(self.model, self.tx, self.config.seed, self.config.train.seq_len, self.mesh,
                               self.sample_inputs, self.state_shardings)
    params = routers.fill_tables_from_data(state.params, self.settings.model, self.train_token_counts)
    if params is not state.params:
      state = state.replace(params=jax.device_put(params, self.state_shardings.params))
    return state

  def train_token_counts(self) -> np.ndarray:
    """Token-id counts of the training split, int64 [model.vocab_size] (computed once)."""
    if not hasattr(self, "_train_token_counts"):
      self._train_token_counts = self.task.train_token_counts(self.data, self.config.model.vocab_size)
    return self._train_token_counts

  def jit_train_step(self):
    return mesh_lib.under_mesh(self.mesh, jit_train_step(self.model, self.tx, self.settings, self.mesh,
                                                         self.state_shardings, self.task))

  def train_batches(self):
    """This process's share of every train batch, as a resumable grain iterator."""
    return self.task.train_iterator(self.data, self.settings, jax.process_index(), jax.process_count())

  def abstract_state(self) -> TrainState:
    """Shapes, dtypes and this mesh's shardings of the train state (for restoring into this layout)."""
    def with_sharding(sharding, shape):  # shape: a ShapeDtypeStruct, or an empty node (optax's MaskedNode)
      return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding) if hasattr(shape, "shape") else shape
    return jax.tree.map(with_sharding, self.state_shardings, jax.eval_shape(self.init_state))

  def restore_for_evaluation(self, step: int | None) -> tuple[int, TrainState]:
    """``(step, state)`` of the checkpoint at ``step`` (None: the latest), laid out on this mesh."""
    step = self.checkpointer.latest_step if step is None else step
    if step is None:
      raise FileNotFoundError(
          f"no checkpoint in {self.workdir / 'checkpoints'}; train first with --mode=train and this --workdir."
      )
    state, _ = self.checkpointer.restore(step, self.abstract_state(), for_training=False)
    return step, state

  def evaluate(self, params, split: str, max_batches: int = 0) -> dict[str, float]:
    """Perplexity on ``split`` with the inference routing; ``max_batches > 0`` evaluates a prefix. Also the tokens
    and the batches scored (fewer than ``max_batches`` when the split has fewer)."""
    batches: Iterable = mesh_lib.global_batches(
        self.task.eval_batches(self.data, self.settings, split, stride=self.settings.eval.stride), self.mesh)
    nll, tokens, scored = 0.0, 0.0, 0
    for batch in batches:
      if 0 < max_batches <= scored:
        break
      sums = self.eval_step(params, batch)
      nll, tokens, scored = nll + sums["nll_sum"], tokens + sums["tokens"], scored + 1
    loss = float(nll) / max(float(tokens), 1.0)
    return {"loss": loss, "perplexity": math.exp(min(loss, 80.0)), "tokens": int(tokens), "batches": scored}

  def eval_mode(self) -> dict:
    """How ``evaluate`` scores a split (the language model: non-overlapping blocks or sliding windows), and
    ``max_batches`` when the final evaluations score only a prefix (``eval.max_batches``)."""
    prefix = self.final_eval_batches
    return {**self.task.eval_description(self.settings), **({"max_batches": prefix} if prefix else {})}

  @property
  def final_eval_batches(self) -> int:
    """The final and ``--mode=eval`` evaluations' batches per split (``eval.max_batches``; 0: the whole split)."""
    return int(self.settings.eval.max_batches)

  def routing_agreement(self, params, split: str = "valid", max_batches: int = 0) -> float | None:
    """Share of ``split``'s tokens whose distilled-router expert equals the learned (stage-1) expert.

    None when the model has no distilled router. Counts every position of the batches evaluated
    (the last batch's padding too); ``max_batches > 0`` uses a prefix.
    """
    agree, count = 0.0, 0
    for i, batch in enumerate(mesh_lib.global_batches(self.task.eval_batches(self.data, self.settings, split),
                                                      self.mesh)):
      if max_batches > 0 and i >= max_batches:
        break
      value = self.routing_agreement_step(params, batch)
      if value is None:
        return None
      agree, count = agree + float(value), count + 1
    return agree / max(count, 1)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       stop_at_step: int | None = None) -> RunSummary | dict:
  """Trains both stages, resuming from the latest checkpoint in ``workdir``, then evaluates.

  After each step the actions of ``actions.py`` run when their ``Schedule`` says: log a window, end stage 1,
  evaluate and judge, save. One ``TrainClock`` times training; it is paused while the boundary check and the
  evaluations run, so ``train_seconds`` and every tokens/s leave them out.

  Args:
    config: the run config.
    workdir: where checkpoints, metrics, the tokenizer and prepared data go.
    stop_at_step: stop after this step without a final save, as a killed run would (for tests).

  Returns:
    The summary also written to ``workdir/summary.json``; ``{"stopped_at_step": step}`` when stopped early.
  """
  exp = Experiment(config, workdir)
  train_cfg = exp.settings.train
  state = exp.init_state()
  train_iter = exp.train_batches()
  start = exp.checkpointer.latest_step
  if start is not None:
    state, data_state = exp.checkpointer.restore(start, ckpt_lib.abstract_like(state))
    if start > train_cfg.steps:  # only a schedule free of train.steps gets here (restore compares the rest)
      raise CheckpointMismatchError(
          f"the latest checkpoint in {exp.workdir / 'checkpoints'} is at step {start}, past train.steps="
          f"{train_cfg.steps}; set --config.train.steps={start} or more to extend the run, or use a new --workdir.")
    train_iter.set_state(data_state)
    print(f"resumed from the checkpoint at step {start} in {exp.workdir}", flush=True)
  start = start or 0
  view = exp.view()
  recorder = RoutingRecorder(view, start)  # routing analysis: drops records past `start`, records every N steps
  recorder.after_step(state, start)
  facts_probe = FactsProbe(view, start)  # data.corpus=facts: every fact's recall and route at each evaluation point
  is_chief = jax.process_index() == 0
  writer = MetricWriter(exp.workdir, resume_step=start) if is_chief else None
  guard = health_lib.CollapseGuard(health_lib.GuardSettings.from_settings(exp.settings), start)
  # Training seconds and scored tokens continue from the runs this one resumes (logged with every window,
  # evaluation and checkpoint, so a resumption continues both counts exactly).
  train_seconds_before = (last_logged(exp.workdir, "train_seconds", start) or 0.0) if start else 0.0
  trained_tokens = (last_logged(exp.workdir, "trained_tokens", start) or 0.0) if start else 0.0
  train_step = exp.jit_train_step()
  schedule = actions.Schedule.from_settings(exp.settings.train)
  clock = TrainClock(train_seconds_before)
  run = actions.RunRecord(
      evaluate=exp.evaluate, routing_agreement=exp.routing_agreement, eval_batches=train_cfg.eval_batches,
      checkpointer=exp.checkpointer, writer=writer, guard=guard, clock=clock, window=actions.Window(clock),
      tokens_per_step=train_cfg.batch_size * train_cfg.seq_len, trained_tokens=trained_tokens,
      last_checkpoint=start if start else None,
      progress=tqdm.tqdm(total=train_cfg.steps, initial=start, desc="train", dynamic_ncols=True, mininterval=1.0,
                         disable=not is_chief))
  try:
    if start:  # the verdict so far, from the windows logged up to the checkpoint (no window lost or counted twice)
      actions.handle_collapses(guard, guard.replay(read_metrics(exp.workdir), start), run.last_checkpoint,
                               announce=False)
    periodic = actions.periodic_work(schedule, run, train_iter, facts_probe, stop_at_step)
    for step in range(start + 1, train_cfg.steps + 1):
      state, metrics = train_step(state, mesh_lib.to_global(next(train_iter), exp.mesh))
      recorder.after_step(state, step)
      run.window.add(metrics)
      run.progress.update(1)
      for when, action in periodic:
        if when(step):
          action(step, state, metrics)
    run.progress.close()
    train_seconds = clock.seconds()
    summary = RunSummary(
        steps=train_cfg.steps,
        stage1_steps=train_cfg.stage1_steps,
        device=device_record(),  # speed columns compare only runs on one kind of device, each alone on it
        num_groups=exp.settings.model.moe.num_groups,  # the routing groups it trained with (0 in the config: one a device)
        train_seconds_this_run=round(clock.wall_seconds(), 1),
        train_seconds=round(train_seconds, 1),  # all runs of this workdir, evaluations excluded
        tokens_per_second=round(train_cfg.steps * run.tokens_per_step / max(train_seconds, 1e-9), 1),
        distill_agreement_at_boundary=last_logged(exp.workdir, "distill_agreement_at_boundary", train_cfg.steps),
        eval=exp.eval_mode(),
        valid=exp.evaluate(state.params, "valid", exp.final_eval_batches),
        test=exp.evaluate(state.params, "test", exp.final_eval_batches),
        health=guard.summary(experiment_contributions(view, state.params, "valid")),
        **exp.task.final_report(view, state.params),
        facts=facts_probe.finish(state.params, train_cfg.steps) if facts_probe.enabled else None,
        analysis=recorder.finish(state, train_cfg.steps) or None)
    if is_chief:
      summary.write(exp.workdir / "summary.json")
    return summary
  except actions.StopTraining as stopped:
    return {"stopped_at_step": stopped.step}
  finally:
    run.progress.close()
    exp.checkpointer.wait()
    exp.checkpointer.close()
    if writer:
      writer.close()


def device_record() -> dict:
  """{"platform": "cpu" | "gpu" | "tpu", "kind": e.g. "NVIDIA H100 80GB HBM3", "count": devices, "processes": n}."""
  device = jax.devices()[0]
  return {"platform": device.platform, "kind": device.device_kind, "count": jax.device_count(),
          "processes": jax.process_count()}


def require_checkpoint(workdir: str | pathlib.Path, step: int | None = None) -> None:
  """FileNotFoundError, one line naming ``workdir/checkpoints``, unless the run there saved a checkpoint (at
  ``step``, when given): the first check of every mode that reads one, made on the files alone."""
  ckpt_lib.require_checkpoint(pathlib.Path(workdir) / "checkpoints", step)


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                        step: int | None = None, split: str = "valid") -> dict:
  """Restores the checkpoint at ``step`` (default: latest) and reports perplexity on ``split``; without that
  checkpoint, FileNotFoundError before anything is built or written (:func:`require_checkpoint`)."""
  require_checkpoint(workdir, step)
  exp = Experiment(config, workdir)
  try:
    step, state = exp.restore_for_evaluation(step)
    result = {"step": step, "split": split, **exp.evaluate(state.params, split, exp.final_eval_batches),
              **exp.task.final_report(exp.view(), state.params, split)}
  finally:
    exp.checkpointer.close()
  return result

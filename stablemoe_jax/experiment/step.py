"""Pure train and eval steps: ``(state, batch) -> (state, metrics)`` and ``(params, batch) -> sums``."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from stablemoe_jax.core.settings import RunSettings
from stablemoe_jax.models.moe import SHUFFLE_RNG
from stablemoe_jax.models.routers import post_update_hook
from stablemoe_jax.models.routing import STATS, MoEStats, layer_stats
from stablemoe_jax.parallel import sharding as sharding_lib
from stablemoe_jax.train.losses import token_nll  # noqa: F401  (re-exported: tests and scripts import it here)
from stablemoe_jax.train.optimizer import learning_rate_schedule
from stablemoe_jax.train.state import TrainState, in_stage1

Batch = dict[str, jax.Array]


def aux_losses(stats: dict[str, MoEStats]) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(the sum of every layer's router losses, {loss name: its sum over the layers}), both summed layer by layer in
  the layers' order, each layer's losses in ``RouterLosses``'s field order."""
  total, by_name = jnp.zeros(()), {}
  for layer in stats.values():
    for name, value in layer.losses.present().items():
      total = total + value
      by_name[name] = by_name.get(name, jnp.zeros(())) + value
  return total, by_name


def moe_metrics(stats: dict[str, MoEStats]) -> dict[str, jax.Array]:
  """The logged ``moe/<layer>/<name>`` metrics of every layer's stats (``MoEStats.metrics``)."""
  return {f"moe/{layer}/{name}": value for layer, record in stats.items() for name, value in record.metrics().items()}


def step_rngs(step_key: jax.Array) -> dict[str, jax.Array]:
  """The rng streams of one (micro)step: dropout, and the MoE token shuffle derived from it by fold_in."""
  return {"dropout": step_key, SHUFFLE_RNG: jax.random.fold_in(step_key, 1)}


def make_train_step(model, tx: optax.GradientTransformation, run: RunSettings,
                    task) -> Callable[[TrainState, Batch], tuple]:
  """Builds the train step for ``model`` and ``tx``; jit it with ``donate_argnums=0``.

  ``task`` (``tasks/base.py``) says which batch entries feed the model and scores its output (``task.train_loss``:
  the models return the head's inputs, to which the task's loss applies the head).

  With ``train.microbatches = M > 1`` the batch [B, S] is split into M
  microbatches of [B / M, S] whose gradients are averaged before one update
  (routing and capacity then act per microbatch, as per device batch in fairseq).

  The MoE layers' stats (one ``routing.MoEStats`` a layer, sown into ``routing.STATS``) give the router losses added
  to the loss (logged ``aux/<name>``, summed over the layers) and the ``moe/<layer>/<name>`` metrics.

  Every update is followed by the chosen router's ``post_update`` hook, where its registry entry has one
  (``routers.post_update_hook``), given the step's stats by layer (averaged over microbatches): e.g. with a
  cosine router's ``cosine_expert_norm`` > 0, ``cosine_routing.expert_norm_hook`` rescales the centroids' rows to
  that norm in the stored parameters
  (X-MoE's rescale before every forward pass; its docstring says why here).
  """
  stage1_steps = run.train.stage1_steps
  microbatches = run.train.microbatches
  schedule = learning_rate_schedule(run.train)
  base_key = jax.random.key(run.seed)
  post_update = post_update_hook(run.model)  # the router's own hook, None for most

  def grads_and_metrics(params, batch: Batch, stage1: jax.Array, step_key: jax.Array):
    def loss_fn(params):
      output, sown = model.apply(
          {"params": params}, *task.model_inputs(batch), stage1, deterministic=False,
          rngs=step_rngs(step_key), mutable=[STATS], **task.model_keywords(batch),
      )
      task_loss = task.train_loss(output, batch)
      stats = layer_stats(sown)
      aux_total, aux_by_name = aux_losses(stats)
      return task_loss + aux_total, (task_loss, aux_by_name, stats)

    (loss, (task_loss, aux_by_name, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    metrics = {
        "loss": loss,
        "task_loss": task_loss,
        **{f"aux/{name}": value for name, value in aux_by_name.items()},  # every router loss, by its name
        **moe_metrics(stats),
    }
    return grads, metrics, stats

  def train_step(state: TrainState, batch: Batch):
    stage1 = in_stage1(state.step, stage1_steps)
    step_key = jax.random.fold_in(base_key, state.step)
    if microbatches == 1:
      grads, metrics, stats = grads_and_metrics(state.params, batch, stage1, step_key)
    else:
      # Microbatch m takes rows m, m + M, ...: an even share of every device's rows.
      split = jax.tree.map(lambda x: x.reshape(-1, microbatches, *x.shape[1:]).swapaxes(0, 1), batch)

      def accumulate(grad_sum, micro):
        micro_batch, index = micro
        grads, metrics, stats = grads_and_metrics(state.params, micro_batch, stage1,
                                                  jax.random.fold_in(step_key, index))
        return jax.tree.map(jnp.add, grad_sum, grads), (metrics, stats)

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      grad_sum, stacked = jax.lax.scan(accumulate, zeros, (split, jnp.arange(microbatches)))
      grads = jax.tree.map(lambda g: g / microbatches, grad_sum)
      metrics, stats = jax.tree.map(lambda m: m.mean(axis=0), stacked)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if post_update is not None:
      params = post_update(params, stats)
    metrics.update(grad_norm=optax.global_norm(grads), learning_rate=schedule(state.step),
                   stage=jnp.where(stage1, 1, 2))
    if "weights" in batch:  # the positions the loss scores (translation: real target tokens)
      metrics["scored_tokens"] = jnp.sum(batch["weights"])
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def jit_train_step(model, tx: optax.GradientTransformation, run: RunSettings, mesh: jax.sharding.Mesh, state_shardings,
                   task):
  """The jitted train step of ``main`` (call it under ``jax.set_mesh(mesh)``).

  ``donate_argnums=0``: the input state's buffers are donated, so XLA writes the new parameters and
  optimizer state in place instead of holding two copies of them during the update.
  """
  return jax.jit(make_train_step(model, tx, run, task), donate_argnums=0,
                 in_shardings=(state_shardings, sharding_lib.batch_sharding(mesh)),
                 out_shardings=(state_shardings, sharding_lib.replicated(mesh)))


def make_eval_step(model, task, stage1_only: bool = False) -> Callable[[dict, Batch], dict[str, jax.Array]]:
  """Eval step with inference routing: returns the task's summed NLL and token count (``task.eval_sums``).

  The inference routing is the distilled router's, except for a run that never leaves stage 1 (``stage1_only``:
  ``train.stage1_steps >= train.steps``, the paper's "stage 1 only" ablation), which is evaluated as it trained,
  with its learned routing.
  """
  def eval_step(params, batch: Batch):
    output = model.apply({"params": params}, *task.model_inputs(batch), jnp.array(stage1_only), deterministic=True,
                         **task.model_keywords(batch))
    return task.eval_sums(output, batch)
  return eval_step


def make_routing_agreement_step(model, task) -> Callable[[dict, Batch], jax.Array | None]:
  """``(params, batch) -> share of the batch's tokens`` whose distilled-router expert is the learned one.

  Runs the model with stage-1 routing (the learned assignment) and reads the ``distill_accuracy``
  stat every distilled router returns (mean over MoE layers); None if no router has it.
  """

  def agreement_step(params, batch: Batch):
    _, sown = model.apply({"params": params}, *task.model_inputs(batch), jnp.array(True), deterministic=True,
                          mutable=[STATS], **task.model_keywords(batch))
    values = [s.router.distill_accuracy for s in layer_stats(sown).values() if s.router.distill_accuracy is not None]
    return sum(values) / len(values) if values else None
  return agreement_step

"""BASE Layers' router (Lewis et al., 2021): in training an exactly balanced assignment of each routing group's
tokens (the auction of ``balanced_assignment.py``), greedy at inference, sigmoid gate, no loss; with
``fixed_routing=True`` StableMoE's two stages (Table 5).

Its settings are the section ``model.moe.base`` (``core.settings.BaseSettings``); ``models/routers.py`` registers it.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from stablemoe_jax.models.balanced_assignment import balanced_assignment
from stablemoe_jax.models.learned_router import LearnedRouter, two_stage_kwargs



@dataclasses.dataclass(frozen=True)
class BalancedAssignment:
  """BASE Layer: in training, each group of T / num_groups tokens is split exactly evenly over the experts
  with maximal total affinity (``balanced_assignment``); greedy at inference; sigmoid gate; no loss.
  Padding tokens take part in the auction (they hold places in its balance), but the MoE layer gives
  them no capacity slot and counts them in no metric."""

  num_groups: int = 1
  epsilon: float = 1e-2
  max_rounds: int = 1000

  def assign(self, scores, deterministic, needed=True):
    greedy = jnp.argmax(scores, axis=-1).astype(jnp.int32)
    if deterministic:
      return greedy, {}
    num_tokens, num_experts = scores.shape
    if num_tokens % (self.num_groups * num_experts):
      raise ValueError(
          f"BASE routing needs the tokens of a step ({num_tokens}) divisible by model.moe.num_groups "
          f"({self.num_groups}) x model.moe.num_experts ({num_experts}); change train.batch_size or train.seq_len.")
    grouped = scores.reshape(self.num_groups, num_tokens // self.num_groups, num_experts)

    def auction(grouped):
      index, info = jax.vmap(lambda s: balanced_assignment(s, self.epsilon, self.max_rounds))(grouped)
      return index.reshape(num_tokens), jnp.max(info["rounds"]), jnp.all(info["converged"])

    # Where the assignment is not used (a two-stage router's stage 2), the auction is skipped.
    index, rounds, converged = jax.lax.cond(
        needed, auction, lambda _: (greedy, jnp.zeros((), jnp.int32), jnp.array(True)), grouped)
    metrics = {"auction_rounds": rounds.astype(jnp.float32), "auction_converged": converged.astype(jnp.float32)}
    return index, metrics

  def gate(self, scores, expert_index):
    return jax.nn.sigmoid(jnp.take_along_axis(scores, expert_index[:, None], axis=-1)[:, 0])

  def losses(self, scores, assignment, weights=None):
    return {}


def build(settings, *, moe, num_experts: int, vocab_size: int) -> nn.Module:
  """The router of ``model.moe.base`` (``settings``), named "router": one auction per routing group."""
  num_groups = int(moe.num_groups or 1)
  policy = BalancedAssignment(num_groups, settings.auction_epsilon, settings.auction_max_rounds)
  return LearnedRouter(num_experts=num_experts, policy=policy, vocab_size=vocab_size,
                       centroid_gain=settings.centroid_gain,
                       **two_stage_kwargs(settings, moe, settings.centroid_gain), name="router", parent=None)


def check(s, moe) -> list[str]:
  """The problems of the section ``model.moe.base``, one message each."""
  del moe
  problems = []
  if not 0 < s.auction_epsilon < 1:
    problems.append(f"model.moe.base.auction_epsilon={s.auction_epsilon} must lie in (0, 1) (default 0.01).")
  if s.auction_max_rounds < 1:
    problems.append(f"model.moe.base.auction_max_rounds={s.auction_max_rounds} must be positive.")
  return problems

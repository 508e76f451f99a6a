"""Routing methods, looked up by name in ``ROUTERS``.

Every router is a Flax module called as
``router(h [T, d], token_ids int32 [B, S] (or [T]), in_stage1 bool scalar, deterministic bool,
token_mask=None) -> Routing`` (T = B * S; ``deterministic`` is false only in training; ``token_mask``
float32 [T], 1 for a real token and 0 for padding, which then counts in no loss and no metric). Its settings are the
config section ``model.moe.<name>``; auxiliary losses are sown into ``aux_loss``
under their own names and logged by the train step as ``aux/<name>``.

The learned routers share one module, :class:`LearnedRouter`: affinities
``s = h E^T`` (float32) to per-expert centroids E, a *policy* that turns them
into an assignment, a gate and losses, and optionally the two-stage procedure
of StableMoE (distil the learned assignment into a token-id-only router during
``train.stage1_steps``, then freeze that router and route by it):

- ``stablemoe``: greedy top-1, sigmoid gate, StableMoE balance loss, always two-stage;
- ``switch``: greedy top-1 on softmax probabilities, gate = that probability,
  load-balancing loss ``N * sum_i f_i P_i`` (optional z-loss and input jitter);
- ``base``: balanced assignment in training (auction, ``balanced_assignment.py``),
  greedy at inference, sigmoid gate, no loss;
- ``switch`` and ``base`` with ``fixed_routing=True``: the same two stages (Table 5).

``hash`` routes by a fixed token-id -> expert table. A new method: a module or
policy here, a builder and default settings in ``ROUTERS``, and its config section.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from stablemoe_jax.models import distill
from stablemoe_jax.models.balanced_assignment import balanced_assignment
from stablemoe_jax.models.cosine_routing import (AFFINITIES, COSINE_DEFAULTS, MAX_LOGIT_SCALE,  # noqa: F401
                                                 check_affinity_keys, cosine_affinities, cosine_kwargs, cosine_scores,
                                                 xmoe_expert_init)
from stablemoe_jax.models.routing import (AUX_LOSS, BALANCE_SCOPES, METRICS, Routing, masked_mean, router_z_loss,
                                          stablemoe_balance_loss)

# How a learned router scores token t against expert i (model.moe.<router>.affinity): "dot" ``h_t . E_i`` (the
# paper) or "cosine" ``cos(P h_t, E_i) / tau`` with a learned temperature tau (X-MoE, Chi et al., 2022): the keys,
# the expert-norm rescale and the shared code are in cosine_routing.py (AFFINITIES, MAX_LOGIT_SCALE re-exported).


# --- policies: affinities -> assignment, gate, losses -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GreedySigmoid:
  """A policy has ``assign(scores [T, N], deterministic, needed) -> (int32 [T], metrics)`` (``needed``: bool
  scalar, false where only a cheap stand-in is wanted), ``gate(scores, index) -> [T]``
  and ``losses(scores, assignment, weights) -> {name: scalar}`` (``weights`` float32 [T] or None: the
  real tokens, over which the losses are taken).

  This one is StableMoE stage 1: greedy top-1, gate ``sigmoid(s[t, e_t])``, balance loss weighted by
  ``balance_alpha`` over the gates of ``balance_scope`` (see ``routing.stablemoe_balance_loss``), and, if
  ``z_loss_weight`` > 0 (a deviation; the paper has none), the router z-loss on the scores.
  """

  balance_alpha: float = 0.3
  balance_scope: str = "assigned"
  z_loss_weight: float = 0.0

  def assign(self, scores, deterministic, needed=True):
    del deterministic, needed
    return jnp.argmax(scores, axis=-1).astype(jnp.int32), {}

  def gate(self, scores, expert_index):
    return jax.nn.sigmoid(jnp.take_along_axis(scores, expert_index[:, None], axis=-1)[:, 0])

  def losses(self, scores, assignment, weights=None):
    losses = {"balance": stablemoe_balance_loss(scores, assignment, self.balance_alpha, self.balance_scope, weights)}
    if self.z_loss_weight > 0:
      losses["z_loss"] = self.z_loss_weight * router_z_loss(scores, weights)
    return losses


def switch_balance_loss(probs: jax.Array, assignment: jax.Array, weights: jax.Array | None = None) -> jax.Array:
  """Switch Transformer's load-balancing loss ``N * sum_i f_i * P_i``.

  f_i: fraction of the T tokens assigned to expert i (no gradient); P_i: mean router
  probability of expert i. probs float32 [T, N], assignment int32 [T], weights float32 [T] or None
  (the real tokens, over which f and P are taken) -> scalar (1 when uniform).
  """
  num_experts = probs.shape[-1]
  token_weights = None if weights is None else weights[:, None]
  fraction = masked_mean(jax.nn.one_hot(assignment, num_experts, dtype=jnp.float32), token_weights, axis=0)
  return num_experts * jnp.sum(jax.lax.stop_gradient(fraction) * masked_mean(probs, token_weights, axis=0))


@dataclasses.dataclass(frozen=True)
class SwitchSoftmax:
  """Switch: greedy top-1 on softmax(s), gate = the chosen probability, weighted balance loss and z-loss."""

  balance_weight: float = 0.01
  z_loss_weight: float = 0.0

  def assign(self, scores, deterministic, needed=True):
    del deterministic, needed
    return jnp.argmax(scores, axis=-1).astype(jnp.int32), {}

  def gate(self, scores, expert_index):
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.take_along_axis(probs, expert_index[:, None], axis=-1)[:, 0]

  def losses(self, scores, assignment, weights=None):
    losses = {"balance": self.balance_weight * switch_balance_loss(
        jax.nn.softmax(scores, axis=-1), assignment, weights)}
    if self.z_loss_weight > 0:
      losses["z_loss"] = self.z_loss_weight * router_z_loss(scores, weights)
    return losses


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


# --- the learned router and its optional two-stage procedure ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DistilledRouterSpec:
  """The shared section ``model.moe.distilled_router`` as a hashable value (see ``distill.make_distilled_router``)."""

  kind: str = "embedding"
  dim: int = 50
  kernel_size: int = 3
  num_layers: int = 1
  num_heads: int = 2
  centroid_gain: float = 0.1

  @classmethod
  def from_config(cls, section, centroid_gain: float = 0.1) -> "DistilledRouterSpec":
    return cls(kind=section.kind, dim=section.dim, kernel_size=section.kernel_size, num_layers=section.num_layers,
               num_heads=section.num_heads, centroid_gain=centroid_gain)


class LearnedRouter(nn.Module):
  """Centroid affinities + a policy, optionally wrapped in StableMoE's two stages.

  Single stage (``distilled is None``): the policy's assignment in every step.
  Two stages: while ``in_stage1``, the policy's assignment, its losses, and a
  distillation loss (cross-entropy of the distilled router's logits against that
  assignment, weight ``distill_weight``) teaching the token-id-only router under
  ``distilled_router``; afterwards (and at inference) the distilled router's
  argmax, with no loss. The optimizer freezes ``distilled_router`` at the
  boundary. The gate always comes from the centroids, which keep learning.

  Attributes:
    num_experts: N.
    policy: GreedySigmoid | SwitchSoftmax | BalancedAssignment (or any object with the same methods).
    vocab_size: vocabulary size (for the distilled router).
    distilled: the distilled router, or None for single-stage routing.
    distill_weight: weight of the distillation loss.
    centroid_gain: orthogonal-init gain of the centroids (0 -> Switch's truncated normal, scale 0.1).
    jitter: multiplicative input noise ``U(1 - jitter, 1 + jitter)`` on h in training (needs a 'dropout' rng).
    affinity: "dot" (``s = h E^T``) or "cosine" (X-MoE: ``s = cos(P h, E) * exp(logit_scale)``, P a
      bias-free projection to ``cosine_dim`` dimensions (none if 0), the learned ``logit_scale`` = log(1/tau)
      starting at log(1/``cosine_temperature``) and clipped at log(MAX_LOGIT_SCALE)).
    cosine_expert_norm: with affinity "cosine", r > 0 initialises the centroids as X-MoE does (orthogonal, rows
      of norm r; ``cosine_routing.xmoe_expert_init``, replacing ``centroid_gain``'s init), and the train step keeps
      them at norm r (``cosine_routing.expert_norm_hook``); 0: neither.
  """

  num_experts: int
  policy: Any
  vocab_size: int = 0
  distilled: DistilledRouterSpec | None = None
  distill_weight: float = 1.0
  centroid_gain: float = 0.1
  jitter: float = 0.0
  affinity: str = "dot"
  cosine_dim: int = 0
  cosine_temperature: float = 0.5
  cosine_expert_norm: float = 0.0

  @nn.compact
  def __call__(self, h: jax.Array, token_ids: jax.Array, in_stage1: jax.Array,
               deterministic: bool = True, token_mask: jax.Array | None = None) -> Routing:
    """h [T, d], token_ids int32 [B, S] or [T], in_stage1 bool scalar, token_mask float32 [T] or None
    -> Routing over T tokens."""
    if self.affinity not in AFFINITIES:
      raise ValueError(f"router affinity {self.affinity!r} is unknown; choose one of {AFFINITIES}.")
    cosine = self.affinity == "cosine"
    if cosine and self.cosine_expert_norm > 0:
      init = xmoe_expert_init(self.cosine_expert_norm)
    elif self.centroid_gain > 0:
      init = nn.initializers.orthogonal(self.centroid_gain)
    else:
      init = nn.initializers.variance_scaling(0.1, "fan_in", "truncated_normal", in_axis=-1, out_axis=-2)
    feature_dim = self.cosine_dim if cosine and self.cosine_dim > 0 else h.shape[-1]
    centroids = self.param("centroids", init, (self.num_experts, feature_dim), jnp.float32)
    h = h.astype(jnp.float32)
    if self.jitter > 0 and not deterministic:
      h = h * jax.random.uniform(self.make_rng("dropout"), h.shape, jnp.float32, 1 - self.jitter, 1 + self.jitter)
    if cosine:
      scores = cosine_affinities(self, h, centroids, self.cosine_dim, self.cosine_temperature)
    else:
      scores = h @ centroids.T  # [T, N]
    learned, policy_metrics = self.policy.assign(
        scores, deterministic, needed=True if self.distilled is None else jnp.asarray(in_stage1))
    for name, value in policy_metrics.items():
      self.sow(METRICS, name, value)
    losses = self.policy.losses(scores, learned, token_mask)
    expert_index = learned
    if self.distilled is not None:
      logits = distill.make_distilled_router(
          self.distilled, self.vocab_size, self.num_experts, name=distill.DISTILLED_ROUTER_NAME)(token_ids)
      distilled = jnp.argmax(logits, axis=-1)
      expert_index = jnp.where(in_stage1, learned, distilled).astype(jnp.int32)
      stage1 = jnp.asarray(in_stage1, jnp.float32)
      target = jax.lax.stop_gradient(learned)
      distill_loss = -masked_mean(
          jnp.take_along_axis(jax.nn.log_softmax(logits), target[:, None], axis=-1)[:, 0], token_mask)
      losses = {name: stage1 * value for name, value in losses.items()}
      losses["distill"] = stage1 * self.distill_weight * distill_loss
      self.sow(METRICS, "distill_loss", distill_loss)
      self.sow(METRICS, "distill_accuracy", masked_mean((distilled == learned).astype(jnp.float32), token_mask))
      # Routing analysis: share of tokens routed elsewhere than the centroids' argmax (0 in stage 1 for StableMoE).
      greedy = jnp.argmax(scores, axis=-1)
      self.sow(METRICS, "centroid_disagreement", masked_mean((expert_index != greedy).astype(jnp.float32),
                                                             token_mask))
    for name, value in losses.items():
      self.sow(AUX_LOSS, name, value)
    return Routing(expert_index=expert_index, gate=self.policy.gate(scores, expert_index))


def StableMoERouter(num_experts: int, vocab_size: int, distill_dim: int = 50, balance_alpha: float = 0.3,  # noqa: N802
                    distill_weight: float = 1.0, centroid_gain: float = 0.1,
                    distilled: DistilledRouterSpec | None = None, name: str | None = None,
                    balance_scope: str = "assigned", z_loss_weight: float = 0.0, affinity: str = "dot",
                    cosine_dim: int = 0, cosine_temperature: float = 0.5,
                    cosine_expert_norm: float = 0.0) -> LearnedRouter:
  """StableMoE (Dai et al., 2022, Sections 3.1-3.3) = the greedy-sigmoid router with its balance loss, two-staged.

  Stage 1: greedy top-1 on ``s = h E^T``, gate ``sigmoid(s[t, a_t])``, balance + distillation losses.
  Stage 2 and inference: the distilled router's argmax; the gate still uses E.
  """
  distilled = distilled or DistilledRouterSpec(dim=distill_dim, centroid_gain=centroid_gain)
  return LearnedRouter(num_experts=num_experts, policy=GreedySigmoid(balance_alpha, balance_scope, z_loss_weight),
                       vocab_size=vocab_size, distilled=distilled, distill_weight=distill_weight,
                       centroid_gain=centroid_gain, affinity=affinity, cosine_dim=cosine_dim,
                       cosine_temperature=cosine_temperature, cosine_expert_norm=cosine_expert_norm, name=name)


# --- the hash router --------------------------------------------------------------------------------------------

def random_hash_table(vocab_size: int, num_experts: int, seed: int) -> np.ndarray:
  """A seeded uniformly random token-id -> expert table: int32 [V]."""
  return np.random.default_rng(seed).integers(0, num_experts, vocab_size).astype(np.int32)


def balanced_hash_table(token_counts: np.ndarray, num_experts: int, seed: int) -> np.ndarray:
  """Greedy bin packing by frequency (Hash Layers' "balanced" hash): int32 [V] from counts [V].

  Token ids in decreasing count order (ties in a seeded random order) go one by one to the expert
  with the fewest training tokens so far (the lowest index among equals).
  """
  counts = np.asarray(token_counts, np.int64)
  tie_break = np.random.default_rng(seed).permutation(counts.size)
  order = np.lexsort((tie_break, -counts))
  table = np.zeros(counts.size, np.int32)
  load = np.zeros(num_experts, np.int64)
  for token in order:
    expert = int(np.argmin(load))
    table[token] = expert
    load[expert] += counts[token]
  return table


class HashRouter(nn.Module):
  """Hash Layer: expert = table[token id], gate 1, no loss.

  The table is a float32 parameter ``table [V]`` holding expert ids: it has no
  gradient, so Adam leaves it bit-identical, and it is saved and restored with the
  checkpoint. It starts as a seeded random table; for the balanced variant
  :func:`fill_tables_from_data` overwrites it once, at initialisation, from the
  training split's token counts.
  """

  num_experts: int
  vocab_size: int
  seed: int = 0

  @nn.compact
  def __call__(self, h: jax.Array, token_ids: jax.Array, in_stage1: jax.Array,
               deterministic: bool = True, token_mask: jax.Array | None = None) -> Routing:
    del in_stage1, deterministic, token_mask
    table = self.param(
        "table", lambda _, shape: jnp.asarray(random_hash_table(shape[0], self.num_experts, self.seed), jnp.float32),
        (self.vocab_size,))
    expert_index = jnp.take(jax.lax.stop_gradient(table), token_ids.reshape(-1)).astype(jnp.int32)
    return Routing(expert_index=expert_index, gate=jnp.ones(expert_index.shape, h.dtype))


# --- the registry -------------------------------------------------------------------------------------------------

def _distilled_section(moe_config):
  """``moe_config.distilled_router``; its defaults where a hand-built config has no such section."""
  section = moe_config.get("distilled_router")
  return section if section is not None else ml_collections.ConfigDict(DISTILLED_ROUTER_DEFAULTS)


def _distilled_spec(moe_config, centroid_gain: float = 0.1) -> DistilledRouterSpec:
  return DistilledRouterSpec.from_config(_distilled_section(moe_config), centroid_gain)


def _num_groups(moe_config) -> int:
  return int(moe_config.get("num_groups", 1) or 1)


def _stablemoe(settings, *, moe_config, num_experts: int, vocab_size: int) -> nn.Module:
  return StableMoERouter(num_experts, vocab_size, balance_alpha=settings.balance_alpha,
                         balance_scope=settings.get("balance_scope", "assigned"),
                         z_loss_weight=settings.get("z_loss_weight", 0.0), **cosine_kwargs(settings),
                         distill_weight=_distilled_section(moe_config).distill_weight,
                         centroid_gain=settings.centroid_gain,
                         distilled=_distilled_spec(moe_config, settings.centroid_gain), name="router")


def _two_stage(settings, moe_config, centroid_gain: float) -> dict:
  if not settings.fixed_routing:
    return {}
  return dict(distilled=_distilled_spec(moe_config, centroid_gain),
              distill_weight=_distilled_section(moe_config).distill_weight)


def _switch(settings, *, moe_config, num_experts: int, vocab_size: int) -> nn.Module:
  return LearnedRouter(num_experts=num_experts, policy=SwitchSoftmax(settings.balance_weight, settings.z_loss_weight),
                       vocab_size=vocab_size, centroid_gain=0.0, jitter=settings.jitter, **cosine_kwargs(settings),
                       **_two_stage(settings, moe_config, 0.1), name="router")


def _base(settings, *, moe_config, num_experts: int, vocab_size: int) -> nn.Module:
  policy = BalancedAssignment(_num_groups(moe_config), settings.auction_epsilon, settings.auction_max_rounds)
  return LearnedRouter(num_experts=num_experts, policy=policy, vocab_size=vocab_size,
                       centroid_gain=settings.centroid_gain,
                       **_two_stage(settings, moe_config, settings.centroid_gain), name="router")


def _hash(settings, *, moe_config, num_experts: int, vocab_size: int) -> nn.Module:
  del moe_config
  return HashRouter(num_experts=num_experts, vocab_size=vocab_size, seed=settings.seed, name="router")


def _check_stablemoe(s, moe_config) -> list[str]:
  get = lambda key: s.get(key, STABLEMOE_DEFAULTS[key])
  problems = [f"model.moe.stablemoe.{k}={get(k)} must be >= 0 (0 turns it off)." for k in
              ("balance_alpha", "centroid_gain", "z_loss_weight") if get(k) < 0]
  scope = get("balance_scope")
  if scope not in BALANCE_SCOPES:
    problems.append(f"model.moe.stablemoe.balance_scope={scope!r} is unknown; choose 'assigned' (the paper's "
                    f"Eq. 3) or 'all' (every token's gate; keeps the gate alive at small scale, README "
                    f"'Router health').")
  return problems + check_affinity_keys("stablemoe", get)


def _check_switch(s, moe_config) -> list[str]:
  problems = [f"model.moe.switch.{k}={s[k]} must be >= 0." for k in ("balance_weight", "z_loss_weight") if s[k] < 0]
  if not 0 <= s.jitter < 1:
    problems.append(f"model.moe.switch.jitter={s.jitter} must lie in [0, 1) (0 turns it off).")
  return problems + check_affinity_keys("switch", lambda key: s.get(key, SWITCH_DEFAULTS[key]))


def _check_base(s, moe_config) -> list[str]:
  problems = []
  if not 0 < s.auction_epsilon < 1:
    problems.append(f"model.moe.base.auction_epsilon={s.auction_epsilon} must lie in (0, 1) (default 0.01).")
  if s.auction_max_rounds < 1:
    problems.append(f"model.moe.base.auction_max_rounds={s.auction_max_rounds} must be positive.")
  return problems


def _check_hash(s, moe_config) -> list[str]:
  if s.table not in ("random", "balanced"):
    return [f"model.moe.hash.table={s.table!r} is unknown; choose 'random' or 'balanced'."]
  return []


@dataclasses.dataclass(frozen=True)
class RouterEntry:
  """A routing method.

  Attributes:
    build: (settings, *, moe_config, num_experts, vocab_size) -> the router module, named "router".
    defaults: the default settings (must equal the section ``model.moe.<name>`` of configs/default.py).
    check: (settings, moe_config) -> problems, one message each naming the key and the fix.
    uses_distilled_router: whether the shared section ``model.moe.distilled_router`` applies.
    fill_from_data: optional (router params, settings, num_experts, token_counts) -> router params, run once at
      initialisation with the training split's token counts [V].
    preset_keys: settings a preset may change from ``defaults`` while another router is chosen (they are then
      unused): the CPU presets turn on small-scale deviations this way, and ``--config.model.moe.router=X``
      still works on them.
  """

  build: Callable[..., nn.Module]
  defaults: dict
  check: Callable[[Any, Any], list[str]]
  uses_distilled_router: Callable[[Any], bool] = lambda settings: False
  fill_from_data: Callable[..., dict] | None = None
  preset_keys: tuple[str, ...] = ()


def _fill_hash(router_params, settings, num_experts, token_counts):
  if settings.table != "balanced":
    return router_params
  table = balanced_hash_table(token_counts(), num_experts, settings.seed)
  return {**router_params, "table": jnp.asarray(table, jnp.float32)}


# StableMoE's settings: the paper's wherever it has one; z_loss_weight and the cosine keys are deviations, off here.
STABLEMOE_DEFAULTS = dict(balance_alpha=0.3, centroid_gain=0.1, balance_scope="assigned", z_loss_weight=0.0,
                          **COSINE_DEFAULTS)
# Switch's: the paper's; the cosine keys (X-MoE's routing, designed for a softmax top-k router) are off here.
SWITCH_DEFAULTS = dict(balance_weight=0.01, z_loss_weight=0.0, jitter=0.0, fixed_routing=False, **COSINE_DEFAULTS)

ROUTERS: dict[str, RouterEntry] = {
    "stablemoe": RouterEntry(
        _stablemoe, STABLEMOE_DEFAULTS, _check_stablemoe, uses_distilled_router=lambda s: True,
        preset_keys=("balance_scope", "z_loss_weight", *COSINE_DEFAULTS)),
    "switch": RouterEntry(
        _switch, SWITCH_DEFAULTS, _check_switch, uses_distilled_router=lambda s: s.fixed_routing,
        preset_keys=tuple(COSINE_DEFAULTS)),
    "base": RouterEntry(
        _base, dict(auction_epsilon=1e-2, auction_max_rounds=1000, centroid_gain=0.1, fixed_routing=False),
        _check_base, uses_distilled_router=lambda s: s.fixed_routing),
    "hash": RouterEntry(_hash, dict(table="random", seed=0), _check_hash, fill_from_data=_fill_hash),
}

DISTILLED_ROUTER_DEFAULTS = dict(kind="embedding", dim=50, distill_weight=1.0, kernel_size=3, num_layers=1,
                                 num_heads=2)


def make_router(moe_config, *, vocab_size: int) -> nn.Module:
  """Builds the router named by ``moe_config.router`` from its own section ``moe_config[router]``."""
  name = moe_config.router
  if name not in ROUTERS:
    raise ValueError(f"unknown router {name!r}; choose one of {sorted(ROUTERS)}")
  return ROUTERS[name].build(moe_config[name], moe_config=moe_config, num_experts=moe_config.num_experts,
                             vocab_size=vocab_size)


def fill_tables_from_data(params: dict, model_config, token_counts: Callable[[], np.ndarray]) -> dict:
  """Applies the chosen router's ``fill_from_data`` to every MoE layer's router parameters.

  Args:
    params: the freshly initialised model parameters.
    model_config: the ``model`` config.
    token_counts: returns the training split's token counts, int [model.vocab_size] (called only if needed).
  """
  moe = model_config.moe
  entry = ROUTERS.get(moe.router)
  dense = model_config.get("dense_match", "none") != "none"
  if not moe.enabled or dense or entry is None or entry.fill_from_data is None:
    return params
  params = dict(params)
  for layer, layer_params in params.items():
    if "router" in getattr(layer_params, "keys", lambda: ())():
      params[layer] = {**layer_params, "router": entry.fill_from_data(
          layer_params["router"], moe[moe.router], moe.num_experts, token_counts)}
  return params

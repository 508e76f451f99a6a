"""The values routing returns: the :class:`Routing` every router returns (its choices, gates, losses and stats), and
the :class:`MoEStats` record each MoE layer reports; the losses routers share.

A router maps token representations ``h [T, d]`` and token ids ``[T]`` to a :class:`Routing`: k experts per token
(k = 1 for top-1 routers), the scalar gate applied to each chosen expert's output, its auxiliary losses as a
:class:`RouterLosses` and its own metrics as a :class:`RouterStats` (typed records, flaxformer's ``RouterIndices``
with its ``auxiliary_loss`` and ``router_z_loss``). The MoE layer adds its load and health to them and sows one
:class:`MoEStats` per layer into the ``moe_stats`` collection, which the train step reads by attribute: adding a
routing method never changes the layer, the model or the train step.
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct, traverse_util

# One MoEStats a MoE layer a call, sown under STATS_NAME (the train step and the routing-agreement step read it).
STATS = "moe_stats"
STATS_NAME = "stats"
# Per-token routing (expert_index, gate) of every MoE layer; sown only when a caller asks (routing analysis).
ROUTING = "routing"


def _present(record) -> dict[str, jax.Array]:
  """The fields of a record that are not None, in field order."""
  return {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if getattr(record, f.name) is not None}


@struct.dataclass
class RouterLosses:
  """A router's auxiliary losses, each a float32 scalar with its weight applied, None where the router has none.

  The train step adds every present loss to the task loss (layer by layer, in field order) and logs each as
  ``aux/<field>``, summed over the MoE layers. A new loss is a new field here (and its name in the registry
  entry's ``losses``).

  Attributes:
    balance: the load-balancing loss (StableMoE's Eq. 3, Switch's ``N sum_i f_i P_i``, DeepSeek's sequence-wise).
    z_loss: the router z-loss (ST-MoE).
    distill: the distilled router's cross-entropy against the learned assignment (two-stage routers, stage 1).
  """

  balance: jax.Array | None = None
  z_loss: jax.Array | None = None
  distill: jax.Array | None = None

  def present(self) -> dict[str, jax.Array]:
    """{name: loss} of the losses this router has, in field order."""
    return _present(self)


@struct.dataclass
class RouterStats:
  """A router's own metrics, float32 scalars, None where the router has none; logged as
  ``moe/<layer>/router/<field>``.

  Attributes:
    router_temperature: the cosine router's learned temperature tau (X-MoE).
    distill_loss: the distilled router's unweighted cross-entropy (two-stage routers).
    distill_accuracy: share of tokens whose distilled-router expert is the learned one.
    centroid_disagreement: share of tokens routed elsewhere than the centroids' argmax.
    auction_rounds: BASE's auction rounds (the most over the groups); auction_converged: 1 if every group converged.
    bias_spread: DeepSeek's largest minus smallest expert bias; mean_affinity: its mean sigmoid affinity.
  """

  router_temperature: jax.Array | None = None
  distill_loss: jax.Array | None = None
  distill_accuracy: jax.Array | None = None
  centroid_disagreement: jax.Array | None = None
  auction_rounds: jax.Array | None = None
  auction_converged: jax.Array | None = None
  bias_spread: jax.Array | None = None
  mean_affinity: jax.Array | None = None

  def present(self) -> dict[str, jax.Array]:
    """{name: value} of the metrics this router has."""
    return _present(self)


class Routing(struct.PyTreeNode):
  """Top-k routing decision for T tokens (k = 1 for every top-1 router), with the router's losses and stats.

  Attributes:
    expert_index: int32 [T, k], the experts each token is sent to, its first (highest-ranked) choice first; the
      k experts of a token are distinct.
    gate: float [T, k], the multiplier on each chosen expert's output (the MoE layer sums the k gated outputs).
    losses: the router's auxiliary losses (none by default).
    stats: the router's own metrics (none by default).
  """

  expert_index: jax.Array
  gate: jax.Array
  losses: RouterLosses = struct.field(default_factory=RouterLosses)
  stats: RouterStats = struct.field(default_factory=RouterStats)

  @property
  def top_k(self) -> int:
    return int(self.expert_index.shape[-1])

  @classmethod
  def top1(cls, expert_index: jax.Array, gate: jax.Array, **losses_and_stats) -> "Routing":
    """A top-1 router's decision from expert_index [T] and gate [T] (``losses=``, ``stats=`` as the fields)."""
    return cls(expert_index=expert_index[:, None], gate=gate[:, None], **losses_and_stats)


@struct.dataclass
class MoEStats:
  """What one MoE layer reports for a call: its router's losses and stats, and its load and health (float32
  scalars but ``load``). Sown once a layer (``STATS``); the train step logs ``metrics()`` as ``moe/<layer>/<name>``.

  Attributes:
    losses: the router's auxiliary losses.
    router: the router's own metrics.
    load: float32 [N], each expert's share of the real tokens' choices (``expert_load``).
    dropped_fraction: share of the real tokens' choices that found no capacity slot.
    mean_gate, low_gate_fraction, load_entropy, load_balance, max_load: ``routing_health``.
  """

  losses: RouterLosses
  router: RouterStats
  load: jax.Array
  dropped_fraction: jax.Array
  mean_gate: jax.Array
  low_gate_fraction: jax.Array
  load_entropy: jax.Array
  load_balance: jax.Array
  max_load: jax.Array

  def metrics(self) -> dict[str, jax.Array]:
    """{name under the layer: value}: the router's stats as ``router/<name>``, then the layer's own."""
    layer = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("losses", "router")}
    return {**{f"router/{name}": value for name, value in self.router.present().items()}, **layer}


def layer_stats(sown) -> dict[str, MoEStats]:
  """{layer path ("/"-joined module names, e.g. ``moe_0``; "" for a layer applied alone): its ``MoEStats``} of an
  apply's sown collections, in the order the layers ran."""
  flat = traverse_util.flatten_dict(sown.get(STATS, {}))
  return {"/".join(key[:-1]): value[0] for key, value in flat.items()}


# Which tokens' gates StableMoE's balance loss acts on, for expert i (model.moe.stablemoe.balance_scope).
BALANCE_SCOPES = ("assigned", "all")


def masked_mean(values: jax.Array, weights: jax.Array | None, axis: int | None = None) -> jax.Array:
  """Mean of ``values`` over ``axis`` (default: all) counting only entries with weight 1; plain mean if None.

  ``weights`` float32 broadcastable to ``values`` (1 = a real token, 0 = padding).
  """
  if weights is None:
    return jnp.mean(values, axis=axis)
  weights = jnp.broadcast_to(weights, values.shape)
  return jnp.sum(values * weights, axis=axis) / jnp.maximum(jnp.sum(weights, axis=axis), 1.0)


def stablemoe_balance_loss(scores: jax.Array, assignment: jax.Array, alpha: float,
                           scope: str = "assigned", weights: jax.Array | None = None) -> jax.Array:
  """StableMoE's balance loss, averaged over tokens as in the authors' code.

  ``scope="assigned"`` is the paper's Eq. (3):
  ``alpha * sum_i c_i * sum_{t in A_i} sigmoid(s[t, i])`` divided by T, with ``c_i = (|A_i| - T/N) / (T/N)``.
  ``|A_i|`` is a count (no gradient); the sigmoid terms carry gradient to the centroids and to the token
  representations.

  ``scope="all"`` (a deviation, README "Router health") sums every token's gate of expert i instead:
  ``alpha * sum_i c_i * sum_t sigmoid(s[t, i])`` divided by T * N (the same scale per token). The
  coefficients sum to zero (``sum_i c_i = 0``), so lowering every score at once no longer lowers the
  loss, and an expert that holds no token still gets its scores raised. With ``"assigned"`` the
  weights ``c_{a_t}`` of the tokens sum to ``N sum_i |A_i|^2 / T - T >= 0``: any imbalance pays for
  shrinking every gate, and an expert without tokens gets no gradient at all.

  Args:
    scores: float32 [T, N] token-to-centroid affinities.
    assignment: int32 [T] greedy expert per token (all tokens, dropped ones too).
    alpha: loss weight (0.3 in the paper).
    scope: "assigned" (the paper) or "all".
    weights: float32 [T], 1 for a real token and 0 for padding (which then counts nowhere: T is the number
      of real tokens); None: every token is real.

  Returns:
    float32 scalar.
  """
  if scope not in BALANCE_SCOPES:
    raise ValueError(f"balance scope {scope!r} is unknown; choose one of {BALANCE_SCOPES}.")
  num_tokens, num_experts = scores.shape
  assigned = jax.nn.one_hot(assignment, num_experts, dtype=jnp.float32)  # [T, N]
  gates = jax.nn.sigmoid(scores)  # [T, N]
  if weights is not None:
    assigned = assigned * weights[:, None]
    gates = gates * weights[:, None]
    num_tokens = jnp.maximum(jnp.sum(weights), 1.0)
  counts = jax.lax.stop_gradient(assigned.sum(axis=0))  # [N]
  mean_load = num_tokens / num_experts
  coefficients = (counts - mean_load) / mean_load  # [N]
  if scope == "all":
    return alpha * jnp.sum(coefficients * gates.sum(axis=0)) / (num_tokens * num_experts)
  gate_mass = (gates * assigned).sum(axis=0)  # [N]
  return alpha * jnp.sum(coefficients * gate_mass) / num_tokens


def router_z_loss(scores: jax.Array, weights: jax.Array | None = None) -> jax.Array:
  """The router z-loss of ST-MoE (Zoph et al., 2022): mean over the real tokens of ``logsumexp_i(s[t, i]) ** 2``.

  scores float32 [T, N], weights float32 [T] or None -> scalar (unweighted: callers multiply their weight).
  """
  return masked_mean(jnp.square(jax.nn.logsumexp(scores, axis=-1)), weights)


def expert_load(expert_index: jax.Array, num_experts: int, weights: jax.Array | None = None) -> jax.Array:
  """Fraction of tokens sent to each expert: float32 [N] from int32 [T] (only real tokens if weights [T]).

  With k choices per token (expert_index [T, k]): the fraction of the choices, each choice counting once.
  """
  if expert_index.ndim == 2:
    choices = expert_index.shape[1]
    weights = None if weights is None else jnp.repeat(weights[:, None], choices, axis=1).reshape(-1)
    expert_index = expert_index.reshape(-1)
  if weights is None:
    return jnp.bincount(expert_index, length=num_experts).astype(jnp.float32) / expert_index.shape[0]
  counts = jnp.zeros((num_experts,), jnp.float32).at[expert_index].add(weights)
  return counts / jnp.maximum(jnp.sum(weights), 1.0)


LOW_GATE = 0.01  # a token whose gate is below this gets (almost) nothing from its expert


def routing_health(expert_index: jax.Array, gate: jax.Array, num_experts: int,
                   weights: jax.Array | None = None) -> dict[str, jax.Array]:
  """Health of one layer's routing of T tokens: float32 scalars, fields of the layer's :class:`MoEStats`.

  Args:
    expert_index: int32 [T] or [T, k], the expert(s) of each token (the load counts every choice).
    gate: float [T] or [T, k], the multiplier(s) on the experts' outputs (the gate metrics read the largest of a
      token's k gates: the first choice's for Switch top-k, but DeepSeek ranks its choices on affinity + bias, so its
      first choice can carry the smaller gate, and only the largest stays in the registry's range [scale / k, scale]).
    num_experts: N.
    weights: float32 [T], 1 = a real token, 0 = padding (not counted); None: all real.

  Returns:
    ``mean_gate``; ``low_gate_fraction`` (share of tokens with gate < ``LOW_GATE``); ``load_entropy``
    (entropy of the per-expert load in nats, ln N when balanced); ``load_balance`` (that entropy / ln N,
    in [0, 1]; 1 for N = 1); ``max_load`` (the largest expert's share of the tokens).
  """
  gate = gate.astype(jnp.float32)
  if gate.ndim == 2:
    gate = jnp.max(gate, axis=-1)
  load = expert_load(expert_index, num_experts, weights)
  entropy = jnp.sum(jax.scipy.special.entr(load))
  return {
      "mean_gate": masked_mean(gate, weights),
      "low_gate_fraction": masked_mean((gate < LOW_GATE).astype(jnp.float32), weights),
      "load_entropy": entropy,
      "load_balance": entropy / jnp.log(num_experts) if num_experts > 1 else jnp.ones(()),
      "max_load": jnp.max(load),
  }

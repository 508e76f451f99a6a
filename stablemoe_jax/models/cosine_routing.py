"""X-MoE's cosine routing (Chi et al., 2022), shared by the learned routers that offer it (``stablemoe``, ``switch``).

A learned router's section ``model.moe.<router>`` holds the keys of ``core.settings.routers.COSINE_KEYS``:

- ``affinity``: "dot" (``s = h E^T``) or "cosine" (``s = cos(P h, E_i) * exp(logit_scale)``, the learned
  ``logit_scale = log(1 / tau)`` clipped at ``log(MAX_LOGIT_SCALE)``, as in tutel's ``CosineTopKGate``);
- ``cosine_dim``: P, a bias-free projection of h to this many dimensions (X-MoE: 16); 0: no projection;
- ``cosine_temperature``: tau's initial value;
- ``cosine_expert_norm``: 0 keeps the centroids (X-MoE's expert embeddings) as the router's own init left them,
  never rescaled. ``r > 0`` is X-MoE's published handling (torchscale's ``Top1Gate`` / ``Top2Gate`` with
  ``use_xmoe``, where ``r = 1.5``): the centroids start orthogonal (``XMOE_INIT_GAIN``) and every row is rescaled
  to norm ``r`` before every forward pass, without gradient.

How the rescale reproduces torchscale's in-place one, and what torchscale's ``Top1Gate`` does that these keys do
not: docs/method.md, "X-MoE's cosine routing against torchscale".
Shape letters: ``models/__init__.py``.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.settings.routers import COSINE_KEYS

AFFINITIES = ("dot", "cosine")
MAX_LOGIT_SCALE = 100.0  # the cosine router's 1 / tau is clipped here (tutel's CosineTopKGate: 1 / 0.01)
XMOE_INIT_GAIN = 0.32  # torchscale: torch.nn.init.orthogonal_(wg, gain=0.32), wg [N, 16]
XMOE_EXPERT_NORM = 1.5  # torchscale: wg.mul_(1.5 / wg_norm) before every forward
ROUTER_MODULE = "router"  # the name every MoE layer gives its router (routers.make_router's builders)
CENTROIDS = "centroids"  # the router's expert embeddings E [N, dim]



def normalize_rows(x: jax.Array, eps: float = 1e-4) -> jax.Array:
  """``x / max(|x_row|, eps)`` over the last axis (torch's ``F.normalize``): a zero row gives 0, not NaN."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def cosine_scores(h: jax.Array, centroids: jax.Array, logit_scale: jax.Array, eps: float = 1e-4) -> jax.Array:
  """X-MoE's affinities: h float32 [T, dim], centroids [N, dim], logit_scale scalar ->
  ``cos(h_t, E_i) * exp(min(logit_scale, log MAX_LOGIT_SCALE))``, float32 [T, N]."""
  scale = jnp.exp(jnp.minimum(logit_scale, np.log(MAX_LOGIT_SCALE)))
  return (normalize_rows(h, eps) @ normalize_rows(centroids, eps).T) * scale


def rescale_rows(x: jax.Array, norm: float, eps: float = 1e-4) -> jax.Array:
  """Every row of x [N, dim] scaled to L2 norm ``norm`` (a zero row stays 0): torchscale's in-place rescale."""
  return normalize_rows(x, eps) * norm


def xmoe_expert_init(norm: float) -> Callable:
  """The centroids' initializer with ``cosine_expert_norm = norm > 0``: torchscale's ``orthogonal_(gain=0.32)``
  followed by its first forward's rescale, i.e. orthogonal rows (for N <= dim; orthonormal columns otherwise)
  of norm ``norm``. (key, shape [N, dim], dtype) -> [N, dim]."""
  orthogonal = nn.initializers.orthogonal(XMOE_INIT_GAIN)
  return lambda key, shape, dtype=jnp.float32: rescale_rows(orthogonal(key, shape, dtype), norm).astype(dtype)


def cosine_affinities(router: nn.Module, h: jax.Array, centroids: jax.Array, cosine_dim: int,
                      cosine_temperature: float) -> tuple[jax.Array, jax.Array]:
  """The cosine path of a learned router, called inside its compact ``__call__`` (the parameters are the router's:
  ``cosine_projection`` (if ``cosine_dim`` > 0) and ``logit_scale``). h float32 [T, d], centroids
  [N, cosine_dim or d] -> (scores float32 [T, N], the temperature tau: the router's ``router_temperature`` stat)."""
  if cosine_dim > 0:
    h = nn.Dense(cosine_dim, use_bias=False, dtype=jnp.float32, param_dtype=jnp.float32,
                 name="cosine_projection")(h)
  logit_scale = router.param("logit_scale", nn.initializers.constant(-np.log(cosine_temperature)), (), jnp.float32)
  temperature = jnp.exp(-jnp.minimum(logit_scale, np.log(MAX_LOGIT_SCALE)))
  return cosine_scores(h, centroids, logit_scale), temperature


def cosine_kwargs(settings) -> dict:
  """A router section's (typed) affinity keys as LearnedRouter's keyword arguments."""
  return {key: getattr(settings, key) for key in COSINE_KEYS}


def expert_norm(settings) -> float:
  """The norm the centroids are held at (0: not held), from a router section (0 for a router without the affinity
  keys)."""
  if not all(hasattr(settings, key) for key in COSINE_KEYS) or settings.affinity != "cosine":
    return 0.0
  return float(settings.cosine_expert_norm)


def expert_norm_hook(model: settings_lib.ModelSettings) -> Callable[[dict], dict] | None:
  """The train step's parameter hook for ``cosine_expert_norm`` > 0, else None.

  Returns ``params -> params`` with every MoE layer's ``router/centroids`` [N, dim] rescaled row by row to the
  chosen router's ``cosine_expert_norm`` (not the distilled router's centroids, which lie one level deeper). The
  train step applies it to the parameters after each optimizer update, so every forward pass, and Adam's next
  update, starts from norm-r rows, as torchscale's in-place ``wg.mul_`` before each forward (module docstring).
  """
  if not model.has_moe_layers:
    return None
  norm = expert_norm(model.moe.router_settings())
  if norm <= 0:
    return None

  def project(path, leaf):
    names = [key.key for key in path if isinstance(key, jax.tree_util.DictKey)]
    return rescale_rows(leaf, norm).astype(leaf.dtype) if names[-2:] == [ROUTER_MODULE, CENTROIDS] else leaf

  return lambda params, stats=None: jax.tree_util.tree_map_with_path(project, params)


def check_affinity_keys(section: str, settings) -> list[str]:
  """The affinity keys of router section ``model.moe.<section>`` (``settings``, typed): one message per problem,
  naming the key and the fix."""
  prefix = f"model.moe.{section}"
  get = lambda key: getattr(settings, key)
  problems = [f"{prefix}.{key}={get(key)} must be >= 0 (0 turns it off; X-MoE's value: {value})." for key, value in
              (("cosine_dim", 16), ("cosine_expert_norm", XMOE_EXPERT_NORM)) if get(key) < 0]
  if get("affinity") not in AFFINITIES:
    problems.append(f"{prefix}.affinity={get('affinity')!r} is unknown; choose 'dot' (h . E_i) or 'cosine' "
                    f"(X-MoE: cos(P h, E_i) / a learned temperature).")
  if not get("cosine_temperature") > 0:
    problems.append(f"{prefix}.cosine_temperature={get('cosine_temperature')} must be > 0 (the learned "
                    f"temperature's initial value; tutel's cosine router starts at 0.5).")
  if get("affinity") != "cosine":
    problems += [f"{prefix}.{key}={get(key)} applies only to cosine routing; add --config.{prefix}.affinity=cosine "
                 f"or drop the override." for key in ("cosine_dim", "cosine_temperature", "cosine_expert_norm")
                 if get(key) != settings_lib.absent_value(type(settings), key)]
  return problems

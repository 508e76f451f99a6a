"""Each router's own settings, the sections ``model.moe.<router>``, and the shared ``model.moe.distilled_router``.

One frozen dataclass per section, each field with its type, its default (the CPU default's value: configs/default.py
is built from these) and a one-line description. ``models/routers.py`` gives each class to its registry entry
(``RouterEntry.settings``); the checks of a section's values stay in that router's module (``check``). A field whose
``absent`` metadata differs from its default is a preset deviation from the paper: a hand-built or older config
without the key means ``absent`` (the paper's router), and another router being chosen leaves it unused without error
(``RouterEntry.preset_keys``)."""
from __future__ import annotations

import dataclasses


_ALWAYS = None


def setting(default, help: str, *, carried=_ALWAYS, added: bool = False, **absent):  # noqa: A002  (argparse's name)
  """A field with its default and one-line description, and where it differs, in its metadata:

  - ``absent=value``: what a config lacking the key means when that is not the default (a key added later, or a
    preset deviation from the paper): ``settings.typed`` fills a missing key with it;
  - ``carried``: the tasks whose presets hold the key (``settings.config_dict``; ``("translation",)``: a
    translation-only key), ``()``: only a preset that states it holds it (a corpus's own keys); default: every task;
  - ``added=True``: a key added after checkpoints were written: a recorded config without it restores where it holds
    its absent value (``train/checkpoint.py``).
  """
  metadata = {"help": help, **absent}
  if carried is not _ALWAYS:
    metadata["carried"] = tuple(carried)
  if added:
    metadata["added"] = True
  return dataclasses.field(default=default, metadata=metadata)


def section(cls, help: str, *, carried=_ALWAYS):  # noqa: A002
  """A nested section: dataclass ``cls`` at its defaults; ``carried`` as :func:`setting`'s."""
  metadata = {"help": help} if carried is _ALWAYS else {"help": help, "carried": tuple(carried)}
  return dataclasses.field(default_factory=cls, metadata=metadata)


PAPER_AFFINITY = "dot"  # the paper's routing affinity, that of a router without the key (train/health.py)


# The affinity keys every learned router's section holds at the paper's values (X-MoE's cosine routing off).
def _affinity(default: str = PAPER_AFFINITY, note: str = "", **absent):
  return setting(default, "dot: s = h . E_i (the paper) | cosine: s = cos(P h, E_i) / tau, tau learned (X-MoE, Chi "
                         f"et al. 2022){note}", **absent)


def _cosine_dim(default: int = 0, **absent):
  return setting(default, "affinity=cosine: P projects h to this many dims (X-MoE: 16); 0: no P", **absent)


def _cosine_temperature():
  return setting(0.5, "affinity=cosine: tau's initial value (tutel's 0.5)")


def _cosine_expert_norm():
  return setting(0.0, "affinity=cosine: X-MoE's published expert embeddings: orthogonal init, every row rescaled to "
                      "this norm after each update (X-MoE: 1.5; models/cosine_routing.py); 0: off (they start at "
                      "centroid_gain, never rescaled), the tuned sweep's rule (docs/results.md, \"X-MoE's routing as "
                      "published\")")


COSINE_KEYS = ("affinity", "cosine_dim", "cosine_temperature", "cosine_expert_norm")


@dataclasses.dataclass(frozen=True)
class StableMoESettings:
  """``model.moe.stablemoe``: StableMoE's router (``models/stablemoe_router.py``)."""

  balance_alpha: float = setting(0.3, "weight of StableMoE's balance loss")
  centroid_gain: float = setting(0.1, "orthogonal-init gain of the routing centroids")
  balance_scope: str = setting("all", "the gates expert i's balance loss acts on: assigned (the paper's Eq. 3: the "
                                      "tokens routed to i) | all (every token's; a deviation, the CPU default's: "
                                      "what each scope measured in the tuned sweep: docs/tuning.md, \"Findings\")",
                               absent="assigned")
  z_loss_weight: float = setting(0.0, "router z-loss weight (mean logsumexp(s)^2; a deviation probed in "
                                      "docs/tuning.md); 0: off, the paper's router")
  affinity: str = _affinity("cosine", "; cosine, a deviation: the best live seed-0 StableMoE cell of the tuned sweep "
                                      "(docs/tuning.md, \"Findings\")", absent=PAPER_AFFINITY)
  cosine_dim: int = _cosine_dim(16, absent=0)
  cosine_temperature: float = _cosine_temperature()
  cosine_expert_norm: float = _cosine_expert_norm()


@dataclasses.dataclass(frozen=True)
class SwitchSettings:
  """``model.moe.switch``: Switch Transformer's router, top-k (GShard, Mixtral) with ``top_k`` > 1."""

  balance_weight: float = setting(0.01, "weight of N * sum_i f_i P_i (the Switch paper's 0.01)")
  z_loss_weight: float = setting(0.0, "router z-loss weight (ST-MoE uses 0.001); 0: off")
  jitter: float = setting(0.0, "training-only multiplicative noise U(1-j, 1+j) on the router input; 0: off")
  fixed_routing: bool = setting(False, "True: distil into the distilled router, freeze after stage 1")
  top_k: int = setting(1, "experts per token: 1 (Switch) | k > 1: the k most probable, renormalised (GShard, "
                          "Mixtral)", added=True)
  affinity: str = _affinity(note="; X-MoE's routing for Switch, as the stablemoe section's")
  cosine_dim: int = _cosine_dim()
  cosine_temperature: float = _cosine_temperature()
  cosine_expert_norm: float = _cosine_expert_norm()


@dataclasses.dataclass(frozen=True)
class BaseSettings:
  """``model.moe.base``: BASE layers' balanced assignment (``models/base_router.py``)."""

  auction_epsilon: float = setting(1e-2, "final auction bid step / score span; gap <= T * eps * span")
  auction_max_rounds: int = setting(1000, "bidding rounds per phase before a balanced fill-in")
  centroid_gain: float = setting(0.1, "orthogonal-init gain of the expert centroids (fairseq's 0.1)")
  fixed_routing: bool = setting(False, "True: distil into the distilled router, freeze after stage 1")


@dataclasses.dataclass(frozen=True)
class HashSettings:
  """``model.moe.hash``: a fixed token-id -> expert table (``models/hash_router.py``)."""

  table: str = setting("random", "random: seeded table | balanced: bin-packed by train token counts")
  seed: int = setting(0, "seed of the table (and of the balanced table's tie order)")


@dataclasses.dataclass(frozen=True)
class DeepSeekSettings:
  """``model.moe.deepseek``: DeepSeek-V3's auxiliary-loss-free routing (``models/deepseek_router.py``): sigmoid
  affinities, top-k on affinity + a per-expert bias, the gates the chosen affinities normalised over the k x
  routed_scale; after every step each bias moves by bias_update_rate * sign(mean load - load_i), outside the optimizer.
  The whole section was added after checkpoints were written."""

  top_k: int = setting(2, "experts per token (DeepSeek-V3: 8 of 256)", added=True)
  routed_scale: float = setting(1.0, "factor on the gates (DeepSeek-V3: 2.5)", added=True)
  bias_update_rate: float = setting(1e-3, "gamma of the per-step bias update (DeepSeek-V3: 0.001); 0: none",
                                    added=True)
  balance_weight: float = setting(0.0, "the sequence-wise balance loss (DeepSeek-V3: 0.0001); 0: off", added=True)
  centroid_gain: float = setting(0.1, "orthogonal-init gain of the expert centroids", added=True)


@dataclasses.dataclass(frozen=True)
class DistilledRouterSettings:
  """``model.moe.distilled_router``: the token-id-only router of StableMoE and of switch / base with
  ``fixed_routing`` (``models/distill.py``)."""

  kind: str = setting("embedding", "embedding | cnn | transformer (all causal)")
  dim: int = setting(50, "routing feature dimension (the paper's 50)")
  distill_weight: float = setting(1.0, "weight of the distillation loss (the paper; the authors' code uses 0.3)")
  kernel_size: int = setting(3, "kind=cnn: token window, the current token included")
  num_layers: int = setting(1, "kind=transformer: layers (the paper tries 1-3)")
  num_heads: int = setting(2, "kind=transformer: attention heads (must divide dim)")

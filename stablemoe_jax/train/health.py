"""The collapse guard: reads each MoE layer's health metrics per log window and flags a layer that stays dead.

The MoE layer sows, every step, ``mean_gate``, ``low_gate_fraction``, ``load_balance``, ``max_load``,
``dropped_fraction`` and ``load_entropy`` (``models.routing.routing_health``); the train step reports
them as ``moe/<layer>/<name>`` and the loop averages them over each log window. After
``health.after_step``, a layer whose window values cross a threshold (gate: ``min_mean_gate``,
``max_low_gate_fraction``; load: ``min_load_balance``) in ``health.patience`` consecutive windows is
flagged dead, once. The loop then prints :meth:`Collapse.message` (``on_collapse="warn"``) or raises
:class:`CollapseError` (``"stop"``).

Resumption: the guard's state is a function of the logged windows, so a resumed run rebuilds it by
:meth:`CollapseGuard.replay` of the ``metrics.jsonl`` records up to the checkpoint (the writer has
already dropped the records the interrupted run wrote after it); no window is lost or counted twice.
"""
from __future__ import annotations

import dataclasses
import math

from stablemoe_jax.core.constants import HEALTH_DEFAULTS as DEFAULTS
from stablemoe_jax.core.errors import require

HEALTH_METRICS = ("mean_gate", "low_gate_fraction", "load_balance", "max_load", "dropped_fraction", "load_entropy")
ON_COLLAPSE = ("warn", "stop")
# Routers whose gate is a sigmoid that can fall to 0. Switch's gate is the top softmax probability, >= 1/N by
# construction (below 0.05 for N > 20 without anything being wrong); Hash's is 1. Their collapse shows in the load.
GATE_CAN_VANISH = ("stablemoe", "base")
DOCS_PAGE = 'docs/router_health.md'


class CollapseError(RuntimeError):
  """A MoE layer collapsed and ``health.on_collapse="stop"``; the message names the layer, numbers and cures."""


@dataclasses.dataclass(frozen=True)
class GuardSettings:
  """The ``health`` config section, resolved (``after_step`` -1 -> the warmup) for one run."""

  min_mean_gate: float
  max_low_gate_fraction: float
  min_load_balance: float
  patience: int
  after_step: int
  on_collapse: str
  check_gate: bool  # False for routers whose gate cannot vanish (GATE_CAN_VANISH)
  router: str

  @classmethod
  def from_config(cls, config) -> "GuardSettings":
    section = {**DEFAULTS, **(config.get("health") or {})}
    after = section["after_step"]
    router = config.model.moe.router
    return cls(min_mean_gate=float(section["min_mean_gate"]),
               max_low_gate_fraction=float(section["max_low_gate_fraction"]),
               min_load_balance=float(section["min_load_balance"]), patience=int(section["patience"]),
               after_step=int(config.train.warmup_steps if after < 0 else after),
               on_collapse=str(section["on_collapse"]), check_gate=router in GATE_CAN_VANISH, router=router)


def layer_health(metrics: dict) -> dict[str, dict[str, float]]:
  """``{'moe/moe_0/mean_gate': x, ...}`` (one log window's metrics) -> ``{'moe_0': {'mean_gate': x, ...}}``.

  Only the names in HEALTH_METRICS are kept; a dense model gives {}.
  """
  layers: dict[str, dict[str, float]] = {}
  for key, value in metrics.items():
    parts = key.split("/")
    if len(parts) >= 3 and parts[0] == "moe" and parts[-1] in HEALTH_METRICS:
      layers.setdefault("/".join(parts[1:-1]), {})[parts[-1]] = float(value)
  return layers


def collapse_reasons(values: dict[str, float], settings: GuardSettings) -> list[str]:
  """The thresholds one layer's window values cross, as readable phrases ([] if healthy)."""
  reasons = []
  if settings.check_gate:
    if values.get("mean_gate", math.inf) < settings.min_mean_gate:
      reasons.append(f"mean gate {values['mean_gate']:.4f} < health.min_mean_gate={settings.min_mean_gate}")
    if values.get("low_gate_fraction", 0.0) > settings.max_low_gate_fraction:
      reasons.append(f"{values['low_gate_fraction']:.1%} of gates < 0.01 > health.max_low_gate_fraction="
                     f"{settings.max_low_gate_fraction}")
  if values.get("load_balance", 1.0) < settings.min_load_balance:
    reasons.append(f"load balance {values['load_balance']:.3f} < health.min_load_balance={settings.min_load_balance}")
  return reasons


@dataclasses.dataclass(frozen=True)
class Collapse:
  """A layer flagged dead at log step ``step`` after ``windows`` consecutive collapsed windows."""

  layer: str
  step: int
  windows: int
  values: dict[str, float]
  reasons: tuple[str, ...]
  router: str

  def message(self) -> str:
    v = self.values
    numbers = ", ".join(f"{name} {v[name]:.4f}" for name in HEALTH_METRICS if name in v)
    return (f"ROUTER HEALTH: MoE layer {self.layer} (router {self.router!r}) is dead at step {self.step}: "
            f"{'; '.join(self.reasons)}, in {self.windows} consecutive log windows "
            f"(last window: {numbers}). The layer adds almost nothing: from here on the run is a dense model "
            f"carrying a dead layer, and its perplexity is not this method's result. Likely cures: "
            f"{'--config.model.moe.stablemoe.balance_scope=all, ' if self.router == 'stablemoe' else ''}a lower "
            f"--config.train.learning_rate, a longer --config.train.warmup_steps, or the balance-loss settings "
            f"(model.moe.stablemoe.balance_alpha, model.moe.switch.balance_weight); see {DOCS_PAGE}.")


class CollapseGuard:
  """Counts, per MoE layer, consecutive collapsed log windows ending after ``settings.after_step``.

  A window counts if all its steps lie after ``after_step`` (it starts after the previous observed step).
  Each layer is flagged at most once; a flagged layer stays dead in the summary whatever follows.
  """

  def __init__(self, settings: GuardSettings, start_step: int = 0):
    self.settings = settings
    self._last_step = start_step
    self._streak: dict[str, int] = {}
    self.last_window: dict[str, dict[str, float]] = {}  # layer -> values of the last observed window
    self.last_window_step: int | None = None
    self.dead: dict[str, Collapse] = {}

  def observe(self, step: int, metrics: dict) -> list[Collapse]:
    """Takes one log window's averaged metrics (ending at ``step``); returns the layers newly flagged dead."""
    layers = layer_health(metrics)
    window_start, self._last_step = self._last_step + 1, step
    if not layers:
      return []
    self.last_window, self.last_window_step = layers, step
    found = []
    for layer, values in layers.items():
      reasons = collapse_reasons(values, self.settings) if window_start > self.settings.after_step else []
      self._streak[layer] = self._streak.get(layer, 0) + 1 if reasons else 0
      if reasons and self._streak[layer] >= self.settings.patience and layer not in self.dead:
        self.dead[layer] = Collapse(layer, step, self._streak[layer], values, tuple(reasons), self.settings.router)
        found.append(self.dead[layer])
    return found

  def replay(self, records: list[dict], up_to_step: int) -> list[Collapse]:
    """Observes the logged windows of ``metrics.jsonl`` records (steps <= ``up_to_step``) in order, from step 0."""
    self._last_step = 0
    found = []
    for record in records:
      if record["step"] <= up_to_step and layer_health(record):
        found += self.observe(record["step"], record)
    self._last_step = max(self._last_step, up_to_step)
    return found

  def summary(self) -> dict:
    """The ``health`` section of summary.json (contribution added by the loop)."""
    settings = dataclasses.asdict(self.settings)
    layers = {layer: {**values, "dead": layer in self.dead,
                      "flagged_at_step": self.dead[layer].step if layer in self.dead else None}
              for layer, values in self.last_window.items()}
    return {"ok": not self.dead, "dead_layers": sorted(self.dead), "last_window_step": self.last_window_step,
            "layers": layers, "guard": settings,
            "reasons": {layer: list(c.reasons) for layer, c in sorted(self.dead.items())}}


def progress_summary(metrics: dict) -> dict[str, str]:
  """The progress bar's health fields: the worst layer's mean gate and load balance ({} without MoE layers)."""
  layers = layer_health(metrics)
  if not layers:
    return {}
  return {"gate": f"{min(v.get('mean_gate', 1.0) for v in layers.values()):.3f}",
          "bal": f"{min(v.get('load_balance', 1.0) for v in layers.values()):.2f}"}


def stop_message(collapse: Collapse, last_checkpoint: int | None) -> str:
  """The CollapseError text of ``on_collapse="stop"``."""
  saved = (f"Nothing was saved after the last checkpoint (step {last_checkpoint}); rerunning resumes from it."
           if last_checkpoint is not None else "No checkpoint was written yet; rerunning starts from step 0.")
  return (f"{collapse.message()} Training stopped (health.on_collapse='stop'). {saved} Fix the cause, or set "
          f"--config.health.on_collapse=warn to train on regardless.")


def check_config(config) -> None:
  """The ``health`` section (optional: a config without it gets ``train.health.DEFAULTS``)."""
  section = config.get("health")
  if section is None:
    return
  for key in sorted(section.keys()):
    require(key in DEFAULTS,
            f"health.{key} is unknown; the health keys are {sorted(DEFAULTS)} (configs/default.py).")
  get = lambda key: section.get(key, DEFAULTS[key])
  for key in ("min_mean_gate", "max_low_gate_fraction", "min_load_balance"):
    require(0.0 <= get(key) <= 1.0, f"health.{key}={get(key)} must lie in [0, 1]; the default is "
                                    f"--config.health.{key}={DEFAULTS[key]}.")
  require(get("patience") >= 1, f"health.patience={get('patience')} must be >= 1 (consecutive log windows of "
                                f"train.log_every steps before a layer is flagged dead).")
  train = config.train
  require(-1 <= get("after_step") < train.steps,
          f"health.after_step={get('after_step')} must lie in [-1, train.steps={train.steps}) (-1: the end of the "
          f"warmup, train.warmup_steps); set --config.health.after_step=-1.")
  require(get("on_collapse") in ON_COLLAPSE,
          f"health.on_collapse={get('on_collapse')!r} is unknown; choose one of {ON_COLLAPSE} "
          f"(warn: print once and train on, stop: end the run with an error).")

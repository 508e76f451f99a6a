"""Router health: one verdict for every router, judged by what each MoE layer does.

A MoE layer is **dead** when it does no measurable work (docs/router_health.md):

* **contribution**: removing it (every expert's output set to 0, ``analysis.contribution``) raises validation
  perplexity by less than ``health.min_contribution`` (1%; why that floor: docs/router_health.md, "The verdict");
  with shared experts (``model.moe.shared_experts``) removing its routed experts, the shared ones kept: the worth
  of routing (the whole layer's worth is reported beside it, never judged); or
* **degenerate routing**: the two busiest of its N > 2 experts take more than ``health.max_top2_load`` of the tokens.

A model with more than one MoE layer (translation: one in the encoder, one in the decoder) is judged as a whole: it
is **dead** when its MoE layers, all removed at once, cost less than ``health.min_contribution``
(``contribution["all_layers"]``), or when every one of its layers is under the line by the rules above; then every
layer is dead. A layer under the line while the model's MoE works is **weak** (``weak_layers``, ``weak_in_training``,
printed once): reported, never a dead run, never a rejected setting. With one MoE layer the model's verdict is its
layer's, and nothing is added to the summary. A run measured before the all-layers measure (no ``all_layers``) is
judged from its per-layer numbers: dead only when every layer is (``model["judged_from"]`` says so).

Both are measured the same way for every router. In training, the contribution is measured at every evaluation
point (``train.eval_every``, on the ``train.eval_batches`` batches the validation uses) and the load in every log
window (``patience`` consecutive windows); a layer found dead after ``health.after_step`` is flagged once, and the
loop prints the message (``on_collapse="warn"``) or raises :class:`~stablemoe_jax.core.errors.CollapseError` (``"stop"``). The run's verdict,
``summary.json["health"]``, is the same rule applied at the end of training, on the final contribution
(``health.contribution_batches`` batches) and the last log window; :func:`judge_health` applies it to any summary's section,
runs written before this rule included, so every committed run is judged alike.

Early warnings, which never make a layer dead: a mean gate pinned near the floor of the range its router can reach
(``health.min_gate_position`` of the way from the floor to the ceiling: [0, 1] for a dot-product sigmoid gate,
[sigmoid(-1/tau), sigmoid(1/tau)] for a cosine one with temperature tau, [1/N, 1] for Switch's top softmax
probability, [1/k, 1] for its first of k renormalised ones; Hash's gate is fixed; each router's registry entry,
``models/routers.py``, says which its gate is), and a low load balance (``health.min_load_balance``). A sparse gate is not a
dead layer: BASE Layer and the dot-product StableMoE keep most gates near 0 and still do work (docs/tuning.md).

Resumption: the guard's state is a function of the logged records (windows and evaluation points), so a resumed run
rebuilds it by :meth:`CollapseGuard.replay` of ``metrics.jsonl`` up to the checkpoint.
"""
from __future__ import annotations

import dataclasses
import math

from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.errors import require
from stablemoe_jax.core.settings import HealthSettings
from stablemoe_jax.models import routers

HEALTH_METRICS = ("mean_gate", "low_gate_fraction", "load_balance", "max_load", "dropped_fraction", "load_entropy")
ON_COLLAPSE = ("warn", "stop")
GATE_KINDS = routers.GATE_KINDS  # what a router's gate is (its registry entry says): its attainable range follows
DOCS_PAGE = 'docs/router_health.md'
# metrics.jsonl's key of the valid-PPL increase with every MoE layer removed at once (a model with > 1 MoE layer)
ALL_LAYERS_KEY = "moe_all_layers/contribution"


@dataclasses.dataclass(frozen=True)
class GuardSettings:
  """The ``health`` config section, resolved (``after_step`` -1 -> the warmup) for one run."""

  min_contribution: float
  max_top2_load: float
  min_gate_position: float
  min_load_balance: float
  patience: int
  after_step: int
  on_collapse: str
  router: str
  gate: str  # GATE_KINDS
  affinity: str  # "dot" | "cosine": a cosine gate's range depends on the logged temperature
  num_experts: int
  top_k: int = 1  # experts per token: a softmax gate renormalised over k > 1 choices reaches [1/k, 1]
  gate_scale: float = 1.0  # the router's factor on its gate (DeepSeek's routed_scale)

  @classmethod
  def from_settings(cls, run: settings_lib.RunSettings) -> "GuardSettings":
    """The guard's thresholds and the chosen router's gate from a run's settings."""
    section, moe = run.health, run.model.moe
    after = section.after_step
    router = moe.router
    router_section = getattr(moe, router, None)
    return cls(min_contribution=float(section.min_contribution),
               max_top2_load=float(section.max_top2_load),
               min_gate_position=float(section.min_gate_position),
               min_load_balance=float(section.min_load_balance), patience=int(section.patience),
               after_step=int(run.train.warmup_steps if after < 0 else after),
               on_collapse=str(section.on_collapse), router=router, gate=gate_kind(moe),
               affinity=str(getattr(router_section, "affinity", settings_lib.PAPER_AFFINITY)),
               num_experts=int(moe.num_experts),
               top_k=routers.top_k(moe) if router in routers.ROUTERS else 1,
               gate_scale=routers.gate_scale(moe) if router in routers.ROUTERS else 1.0)


def gate_kind(moe) -> str:
  """What the chosen router's gate is, from its registry entry (``RouterEntry.gate_kind``; "sigmoid" for a router
  the registry does not know)."""
  return routers.gate_kind(moe) if moe.router in routers.ROUTERS else "sigmoid"


def gate_range(settings: GuardSettings, values: dict[str, float]) -> tuple[float, float] | None:
  """(floor, ceiling) the layer's gate can reach, or None (a fixed gate; a cosine gate without a logged temperature).

  A sigmoid of a dot product reaches (0, 1); of a cosine divided by tau, [sigmoid(-1/tau), sigmoid(1/tau)];
  a top-1 softmax probability over N experts, [1/N, 1].
  """
  if settings.gate == "fixed":
    return None
  if settings.gate == "softmax":
    return settings.gate_scale / max(settings.num_experts if settings.top_k <= 1 else settings.top_k, 1), \
        settings.gate_scale
  if settings.affinity == "cosine":
    tau = values.get("router_temperature")
    if tau is None or not tau > 0:
      return None
    return _sigmoid(-1.0 / tau), _sigmoid(1.0 / tau)
  return 0.0, 1.0


def gate_position(settings: GuardSettings, values: dict[str, float]) -> float | None:
  """Where the mean gate sits in its attainable range: 0 at the floor, 1 at the ceiling (None: no range)."""
  bounds = gate_range(settings, values)
  if bounds is None or "mean_gate" not in values or bounds[1] <= bounds[0]:
    return None
  return (values["mean_gate"] - bounds[0]) / (bounds[1] - bounds[0])


def _sigmoid(x: float) -> float:
  return 1.0 / (1.0 + math.exp(-x))


def layer_health(metrics: dict) -> dict[str, dict[str, float]]:
  """One log window's metrics -> ``{layer: {name: value}}``.

  Keeps HEALTH_METRICS (``moe/<layer>/<name>``), the cosine router's temperature
  (``moe/<layer>/router/router_temperature``) and, from the per-expert load ``moe/<layer>/load`` [N], the share of
  tokens on the two busiest experts ``top2_load`` and ``num_experts``; a dense model gives {}.
  """
  layers: dict[str, dict[str, float]] = {}
  for key, value in metrics.items():
    parts = key.split("/")
    if len(parts) < 3 or parts[0] != "moe":
      continue
    name, layer = parts[-1], "/".join(parts[1:-1])
    if name in HEALTH_METRICS:
      layers.setdefault(layer, {})[name] = float(value)
    elif name == "load" and hasattr(value, "__len__") and len(value) > 0:
      loads = sorted((float(v) for v in value), reverse=True)
      layers.setdefault(layer, {}).update(top2_load=sum(loads[:2]), num_experts=float(len(loads)))
    elif name == "router_temperature" and len(parts) >= 4 and parts[-2] == "router":
      layers.setdefault("/".join(parts[1:-2]), {})["router_temperature"] = float(value)
  return layers


def logged_contributions(record: dict) -> dict[str, float]:
  """``{layer: relative valid-PPL increase without it}`` of an evaluation record (``moe/<layer>/contribution``)."""
  return {"/".join(key.split("/")[1:-1]): float(value) for key, value in record.items()
          if key.startswith("moe/") and key.endswith("/contribution")}


def degenerate_reasons(values: dict[str, float], max_top2_load: float) -> list[str]:
  """The degenerate-routing rule of one layer's window ([] when healthy or its load was not logged)."""
  top2, experts = values.get("top2_load"), values.get("num_experts", 0)
  if top2 is None or experts <= 2 or top2 <= max_top2_load:
    return []
  return [f"the two busiest of its {int(experts)} experts take {top2:.1%} of the tokens > health.max_top2_load="
          f"{max_top2_load} (degenerate routing)"]


def contribution_reasons(contribution: float | None, min_contribution: float, shared: bool = False) -> list[str]:
  """The contribution rule ([] when the layer is worth at least ``min_contribution`` or was not measured);
  ``shared``: the layer has shared experts, so ``contribution`` is its routed experts' worth."""
  if contribution is None or contribution >= min_contribution:
    return []
  removed = "removing its routed experts (its shared experts kept)" if shared else "removing it"
  return [f"{removed} raises validation perplexity by {contribution:+.2%} < health.min_contribution="
          f"{min_contribution} (no measurable work)"]


def all_layers_reasons(contribution: float | None, min_contribution: float, count: int) -> list[str]:
  """The whole model's contribution rule: its ``count`` MoE layers removed at once ([] when they are worth at least
  ``min_contribution`` or were not measured)."""
  if contribution is None or contribution >= min_contribution:
    return []
  return [f"removing all {count} MoE layers at once raises validation perplexity by {contribution:+.2%} < "
          f"health.min_contribution={min_contribution} (the model's MoE does no measurable work)"]


def every_layer_reasons(count: int) -> list[str]:
  return [f"every one of its {count} MoE layers is under the line (the model's MoE does no measurable work)"]


def warning_reasons(values: dict[str, float], settings: GuardSettings) -> list[str]:
  """The early-warning rules of one layer's window: a gate pinned at its floor, a low load balance."""
  reasons = []
  position = gate_position(settings, values)
  if position is not None and position < settings.min_gate_position:
    low, high = gate_range(settings, values)
    reasons.append(f"mean gate {values['mean_gate']:.4f} sits {position:.1%} of the way up the range its router can "
                   f"reach [{low:.3f}, {high:.3f}] (< health.min_gate_position={settings.min_gate_position})")
  if values.get("load_balance", 1.0) < settings.min_load_balance:
    reasons.append(f"load balance {values['load_balance']:.3f} < health.min_load_balance={settings.min_load_balance}")
  return reasons


@dataclasses.dataclass(frozen=True)
class Collapse:
  """A layer found dead (``dead``) or warned about (early warning) at step ``step``."""

  layer: str
  step: int
  values: dict[str, float]
  reasons: tuple[str, ...]
  router: str
  dead: bool = True
  weak: bool = False  # under the line while another MoE layer of the model works: reported, never a dead run

  def message(self) -> str:
    v = self.values
    numbers = ", ".join(f"{name} {v[name]:.4f}" for name in (*HEALTH_METRICS, "top2_load", "contribution",
                                                             "all_layers_contribution") if name in v)
    cures = (f"Likely cures: {''.join(cure + ', ' for cure in routers.collapse_cures(self.router))}"
             f"a lower --config.train.learning_rate, a longer --config.train.warmup_steps, or the balance-loss settings "
             f"(model.moe.stablemoe.balance_alpha, model.moe.switch.balance_weight); see {DOCS_PAGE}.")
    if self.weak:
      return (f"ROUTER HEALTH: MoE layer {self.layer} (router {self.router!r}) is weak at step {self.step}: "
              f"{'; '.join(self.reasons)} (values: {numbers}), while another MoE layer of the model works. A weak "
              f"layer, not a dead run: a model with several MoE layers is dead only when all of them removed at once "
              f"cost < health.min_contribution, or when every layer is under the line; see {DOCS_PAGE}.")
    if not self.dead:
      return (f"ROUTER HEALTH warning: MoE layer {self.layer} (router {self.router!r}) at step {self.step}: "
              f"{'; '.join(self.reasons)} (values: {numbers}). An early warning, not a verdict: the layer is judged by "
              f"its contribution at the evaluation points and its load. {cures}")
    return (f"ROUTER HEALTH: MoE layer {self.layer} (router {self.router!r}) is dead at step {self.step}: "
            f"{'; '.join(self.reasons)} (values: {numbers}). The layer adds almost nothing: from here on the run "
            f"is a dense model carrying a dead layer, and its perplexity is not this method's result. {cures}")


class CollapseGuard:
  """Applies the verdict during training: log windows (load, early warnings) and evaluation points (contribution).

  A window counts if all its steps lie after ``after_step`` (it starts after the previous observed step); an
  evaluation point counts if it lies after ``after_step``. Each layer is flagged dead at most once, and warned
  about at most once. With more than one MoE layer the model is judged as a whole (the module doc): a layer under
  the line while the model's MoE works is flagged weak (once), and every layer dead when the model is.
  """

  def __init__(self, settings: GuardSettings, start_step: int = 0):
    self.settings = settings
    self._last_step = start_step
    self._degenerate_streak: dict[str, int] = {}
    self._warning_streak: dict[str, int] = {}
    self._degenerate_below: dict[str, list[str]] = {}  # layers degenerate for ``patience`` windows, to the last one
    self._contribution_below: dict[str, list[str]] = {}  # layers under the line at the last evaluation point
    self.layers: set[str] = set()  # every MoE layer seen
    self.last_window: dict[str, dict[str, float]] = {}  # layer -> values of the last observed window
    self.last_window_step: int | None = None
    self.dead: dict[str, Collapse] = {}
    self.weak: dict[str, Collapse] = {}
    self.warnings: dict[str, Collapse] = {}

  def observe(self, step: int, metrics: dict) -> list[Collapse]:
    """Takes one log window's averaged metrics (ending at ``step``); returns the layers newly flagged or warned."""
    layers = layer_health(metrics)
    window_start, self._last_step = self._last_step + 1, step
    if not layers:
      return []
    self.last_window, self.last_window_step = layers, step
    self.layers |= set(layers)
    counted = window_start > self.settings.after_step
    for layer, values in layers.items():
      degenerate = degenerate_reasons(values, self.settings.max_top2_load) if counted else []
      if self._streak(self._degenerate_streak, layer, degenerate):
        self._degenerate_below[layer] = degenerate
      else:
        self._degenerate_below.pop(layer, None)
    found = self._judge(step, lambda layer: layers.get(layer, self.last_window.get(layer, {})))
    for layer, values in layers.items():
      warnings = warning_reasons(values, self.settings) if counted else []
      if self._streak(self._warning_streak, layer, warnings) and layer not in self.warnings:
        self.warnings[layer] = Collapse(layer, step, values, tuple(warnings), self.settings.router, dead=False)
        found.append(self.warnings[layer])
    return found

  def _streak(self, streaks: dict[str, int], layer: str, reasons: list[str]) -> bool:
    streaks[layer] = streaks.get(layer, 0) + 1 if reasons else 0
    return bool(reasons) and streaks[layer] >= self.settings.patience

  def _judge(self, step: int, values, all_layers: float | None = None) -> list[Collapse]:
    """Flags the layers under the line now (degenerate for ``patience`` windows, or under the contribution line at
    the last evaluation point): dead with one MoE layer or when the model is dead (``all_layers``, every layer's
    routed experts removed at once, under the line; or every layer under it), else weak. ``values(layer)``: the
    numbers its message shows."""
    below: dict[str, list[str]] = {}
    for source in (self._contribution_below, self._degenerate_below):
      for layer, reasons in source.items():
        below.setdefault(layer, []).extend(reasons)
    count = len(self.layers)
    model = all_layers_reasons(all_layers, self.settings.min_contribution, count) if count > 1 else []
    if count > 1 and self.layers <= set(below):
      model += every_layer_reasons(count)
    found = []
    for layer in (sorted(self.layers) if model else sorted(below)):
      reasons = tuple(below.get(layer, [])) + tuple(model)
      if count <= 1 or model:
        if layer not in self.dead:
          self.dead[layer] = Collapse(layer, step, values(layer), reasons, self.settings.router)
          found.append(self.dead[layer])
      elif layer not in self.weak and layer not in self.dead:
        self.weak[layer] = Collapse(layer, step, values(layer), reasons, self.settings.router, dead=False, weak=True)
        found.append(self.weak[layer])
    return found

  def observe_contribution(self, step: int, contributions: dict[str, float],
                           all_layers: float | None = None) -> list[Collapse]:
    """Takes an evaluation point's ``{layer: relative PPL increase without it}`` (and, with more than one MoE layer,
    ``all_layers``: the increase without all of them at once); returns the layers newly dead or weak."""
    if step <= self.settings.after_step:
      return []
    self.layers |= set(contributions)
    self._contribution_below = {layer: reasons for layer, value in contributions.items()
                                if (reasons := contribution_reasons(value, self.settings.min_contribution))}
    extra = {} if all_layers is None else {"all_layers_contribution": all_layers}
    return self._judge(step, lambda layer: {**self.last_window.get(layer, {}), **(
        {"contribution": contributions[layer]} if layer in contributions else {}), **extra}, all_layers)

  def replay(self, records: list[dict], up_to_step: int) -> list[Collapse]:
    """Observes the logged windows and evaluation points of ``metrics.jsonl`` (steps <= ``up_to_step``) in order."""
    self._last_step = 0
    found = []
    for record in records:
      if record["step"] > up_to_step:
        continue
      if layer_health(record):
        found += self.observe(record["step"], record)
      if logged_contributions(record):
        found += self.observe_contribution(record["step"], logged_contributions(record), record.get(ALL_LAYERS_KEY))
    self._last_step = max(self._last_step, up_to_step)
    return found

  def summary(self, contribution: dict | None = None) -> dict:
    """The ``health`` section of summary.json: the final verdict on the last window and ``contribution`` (the
    final contribution measure, :func:`analysis.contribution.layer_contributions`' result), what was flagged in
    training (with more than one MoE layer, the weak layers apart), and the early warnings."""
    health = {"last_window_step": self.last_window_step, "layers": self.last_window,
              "guard": dataclasses.asdict(self.settings),
              "flagged_in_training": {layer: {"step": c.step, "reasons": list(c.reasons)}
                                      for layer, c in sorted(self.dead.items())},
              "warnings": {layer: {"step": c.step, "reasons": list(c.reasons)}
                           for layer, c in sorted(self.warnings.items())},
              "contribution": contribution if contribution is not None else {"layers": {}}}
    if len(self.layers | set(health["contribution"].get("layers", {}))) > 1:
      health["weak_in_training"] = {layer: {"step": c.step, "reasons": list(c.reasons)}
                                    for layer, c in sorted(self.weak.items())}
    return {**health, **verdict(health, self.settings.min_contribution, self.settings.max_top2_load)}


def verdict(health: dict, min_contribution: float = HealthSettings.min_contribution,
            max_top2_load: float = HealthSettings.max_top2_load) -> dict:
  """The rule on a ``health`` section's last window (``layers``) and final ``contribution``:
  ``{"ok", "dead_layers", "verdict": {layer: {"dead", "reasons", "contribution", "top2_load"}}}``; a layer with
  shared experts judged by its routed experts' worth (``contribution``), with ``whole_layer_contribution`` beside
  it. With more than one MoE layer the model is judged as a whole (the module doc), and the result adds
  ``"weak_layers"`` (under the line while the model's MoE works), each layer's ``"weak"``, and ``"model": {"dead",
  "reasons", "all_layers_contribution", "judged_from"}``; ``dead_layers`` is then every layer or none."""
  contribution_section = health.get("contribution") or {}
  contributions = contribution_section.get("layers", {})
  names = sorted(set(health.get("layers", {})) | set(contributions))
  judged, below = {}, {}
  for layer in names:
    values = health.get("layers", {}).get(layer, {})
    contribution = contributions.get(layer, {}).get("relative_perplexity_increase")
    whole = contributions.get(layer, {}).get("whole_layer_relative_perplexity_increase")
    below[layer] = (contribution_reasons(contribution, min_contribution, shared=whole is not None)
                    + degenerate_reasons(values, max_top2_load))
    judged[layer] = {"dead": bool(below[layer]), "reasons": below[layer], "contribution": contribution,
                     "top2_load": values.get("top2_load")}
    if whole is not None:
      judged[layer]["whole_layer_contribution"] = whole
  if len(names) <= 1:  # one MoE layer: the model's verdict is the layer's
    dead = sorted(layer for layer, v in judged.items() if v["dead"])
    return {"ok": not dead, "dead_layers": dead, "verdict": judged}
  all_layers = (contribution_section.get("all_layers") or {}).get("relative_perplexity_increase")
  model = all_layers_reasons(all_layers, min_contribution, len(names))
  if all(below.values()):
    model += every_layer_reasons(len(names))
  for layer in names:
    judged[layer].update(dead=bool(model), weak=bool(below[layer]) and not model, reasons=below[layer] + model)
  judged_from = ("all MoE layers removed at once" if all_layers is not None else
                 "each layer's own numbers only: this run has no all-layers measure (it predates it), so it is "
                 "dead only when every layer is")
  return {"ok": not model, "dead_layers": sorted(names) if model else [], "verdict": judged,
          "weak_layers": [] if model else sorted(layer for layer in names if below[layer]),
          "model": {"dead": bool(model), "reasons": model, "all_layers_contribution": all_layers,
                    "judged_from": judged_from}}


def least_contribution(health: dict) -> float | None:
  """The smallest relative valid-PPL increase when one MoE layer is removed (with shared experts: its routed experts),
  of a ``health`` section (None: no MoE layer, or none measured)."""
  layers = (health.get("contribution") or {}).get("layers") or {}
  return min((c["relative_perplexity_increase"] for c in layers.values()), default=None)


def judge_health(health_section: dict | None, metrics_records: list[dict] | None = None) -> dict:
  """:func:`verdict` of any run's summary.json ``health`` section (one rule for every run, those written before this rule too), at the
  thresholds the run recorded (``health.guard``), else the defaults; the last window's load comes from
  ``metrics_records`` (its metrics.jsonl) when the section lacks it. No health section (None or empty: a dense
  run, an old run) gives ``{"ok": True, ...}``."""
  health = dict(health_section or {})
  guard = health.get("guard") or {}
  thresholds = {key: guard.get(key, getattr(HealthSettings, key)) for key in ("min_contribution", "max_top2_load")}
  layers = {layer: dict(values) for layer, values in (health.get("layers") or {}).items()}
  missing = [layer for layer, values in layers.items() if "top2_load" not in values]
  if missing and metrics_records:
    for record in reversed(metrics_records):
      logged = layer_health(record)
      if all("top2_load" in logged.get(layer, {}) for layer in missing):
        for layer in missing:
          layers[layer].update(top2_load=logged[layer]["top2_load"], num_experts=logged[layer]["num_experts"])
        break
  health["layers"] = layers
  return verdict(health, **thresholds)


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


def check_config(run: settings_lib.RunSettings) -> None:
  """The ``health`` section (a config without it gets ``core.settings.HealthSettings``' defaults)."""
  section = run.health
  get = lambda key: getattr(section, key)
  for key in ("min_contribution", "max_top2_load", "min_gate_position", "min_load_balance"):
    require(0.0 <= get(key) <= 1.0, f"health.{key}={get(key)} must lie in [0, 1]; the default is "
                                    f"--config.health.{key}={getattr(HealthSettings, key)}.")
  require(get("patience") >= 1, f"health.patience={get('patience')} must be >= 1 (consecutive log windows of "
                                f"train.log_every steps before a layer's load is judged degenerate or warned about).")
  train = run.train
  require(-1 <= get("after_step") < train.steps,
          f"health.after_step={get('after_step')} must lie in [-1, train.steps={train.steps}) (-1: the end of the "
          f"warmup, train.warmup_steps); set --config.health.after_step=-1.")
  require(get("on_collapse") in ON_COLLAPSE,
          f"health.on_collapse={get('on_collapse')!r} is unknown; choose one of {ON_COLLAPSE} "
          f"(warn: print once and train on, stop: end the run with an error).")

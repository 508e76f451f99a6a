"""Each method at its best: a learning-rate x warmup grid per method, the choice on validation, seeds at the choice.

With ``compare.grid.learning_rate`` and/or ``compare.grid.warmup_steps`` set (comma-separated values), the
grid is their cross product, plus the settings of ``compare.grid.extra`` ("LR/WARMUP" pairs, e.g. "6e-3/600": a
grid extended past its corner without the cross product's every cell). The comparison command trains, for every
method of ``compare.methods``:

1. the grid: one run (seed ``config.seed``) per setting, under the selection budget ``compare.grid.steps``
   (0: ``train.steps``; a shorter budget scales ``train.stage1_steps`` with it), in
   ``DIR/<method>/<setting>/seed0`` (full budget) or ``DIR/<method>/<setting>/steps<N>_seed0``;
2. the choice: the setting with the lowest *validation* perplexity among the runs whose MoE layers are alive by
   the health verdict (``train/health.py``: a layer is dead when removing it costs < 1% of validation perplexity
   or its routing is degenerate; a model with several MoE layers is dead only as a whole, and a weak layer, under
   the line while another works, rejects nothing; a dense model is always alive); if every setting died, the lowest
   of all, marked;
3. ``compare.seeds`` new seeds at the choice under the full budget, ``config.seed + 1`` ... ``config.seed +
   compare.seeds``, in ``DIR/<method>/<setting>/seed<k>``: the reported runs. The grid's run (seed 0) chose the
   setting and is never reported, so no number in the table is the one that was selected on. A choice whose layer
   dies in one of its seeds is rejected (a setting that kills the layer one time in three is not one a user can
   train at): the choice moves to the next live setting and its seeds are run; the rejected choice and its seeds
   stay in the report.

A run stopped by a non-finite loss or gradient (``runner.RunDiverged``; its ``diverged.json`` keeps later calls
from training it again) does not stop the sweep: a diverged grid setting is not eligible, a choice one of whose
seeds diverged is rejected as a dying one is (and is not among the fallbacks of "every setting dead"), and a
method whose every setting diverged gets no choice.

Only ``train.learning_rate`` and ``train.warmup_steps`` vary between settings; every method trains under the
same budget otherwise. Runs are resumable exactly as the comparison's: a run with a summary.json (in DIR or under
``compare.results_dir``) is not redone, a killed one resumes from its checkpoint.
"""
from __future__ import annotations

import dataclasses
import pathlib

import ml_collections

from stablemoe_jax.compare import runner
from stablemoe_jax.compare.comparison import Comparison
from stablemoe_jax.compare.methods import method_configs
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.train import health as health_lib


@dataclasses.dataclass(frozen=True)
class Setting:
  learning_rate: float
  warmup_steps: int

  @property
  def name(self) -> str:
    return f"lr{self.learning_rate:g}_warmup{self.warmup_steps}"

  def as_dict(self) -> dict:
    return {"learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps, "name": self.name}


@dataclasses.dataclass(frozen=True)
class Grid:
  settings: tuple[Setting, ...]  # the shared grid
  steps: int  # the selection budget
  per_method: tuple[tuple[str, tuple[Setting, ...]], ...] = ()  # compare.grid.per_method: (method, its grid)

  def for_method(self, name: str) -> tuple[Setting, ...]:
    """The settings ``name`` is tuned over: its own grid when ``compare.grid.per_method`` names it, else the shared."""
    return dict(self.per_method).get(name, self.settings)

  def is_fixed(self, name: str) -> bool:
    """``compare.grid.per_method`` gives ``name`` one setting: no choice to make, so no selection run."""
    return len(dict(self.per_method).get(name, ())) == 1

  @property
  def columns(self) -> tuple[Setting, ...]:
    """Every setting of any method, the shared grid's first: the report's columns."""
    extra = [s for _, grid in self.per_method for s in grid if s not in self.settings]
    return self.settings + tuple(dict.fromkeys(extra))


def _values(text, kind, key: str) -> list:
  values = []
  for item in str(text or "").split(","):
    if not item.strip():
      continue
    try:
      value = kind(float(item)) if kind is int else kind(item)
    except ValueError:
      raise ConfigError(f"compare.grid.{key}={text!r}: {item.strip()!r} is not a number; give comma-separated "
                        f"values, e.g. --config.compare.grid.{key}=1e-3,2e-3,4e-3.") from None
    if kind is int and float(item) != value:
      raise ConfigError(f"compare.grid.{key}={text!r}: {item.strip()!r} is not a whole number of steps.")
    values.append(value)
  if len(set(values)) != len(values):
    raise ConfigError(f"compare.grid.{key}={text!r} names a value twice.")
  return values


def _extra_settings(text, key: str = "extra") -> list[Setting]:
  settings = []
  for item in str(text or "").split(","):
    if not item.strip():
      continue
    rate, _, warmup = item.partition("/")
    try:
      setting = Setting(float(rate), int(warmup))
    except ValueError:
      raise ConfigError(f"compare.grid.{key}={text!r}: {item.strip()!r} is not LR/WARMUP; give comma-separated "
                        f"pairs, e.g. --config.compare.grid.extra=6e-3/400,6e-3/600.") from None
    settings.append(setting)
  return settings


def _per_method(text, shared: list[Setting], methods: list[str]) -> list[tuple[str, tuple[Setting, ...]]]:
  """``compare.grid.per_method``: "METHOD=LR/W,...;METHOD=+LR/W,..." -> [(method, its settings)]. "=" replaces the
  shared grid for that method, "=+" adds to it."""
  result = []
  for part in str(text or "").split(";"):
    if not part.strip():
      continue
    name, sep, pairs = part.partition("=")
    name = name.strip()
    if not sep or not name:
      raise ConfigError(f"compare.grid.per_method={text!r}: {part.strip()!r} is not METHOD=LR/W,...; e.g. "
                        f"--config.compare.grid.per_method='switch_cosine=6e-3/400,4e-3/400;stablemoe_all=+6e-3/40'.")
    if name not in methods:
      raise ConfigError(f"compare.grid.per_method names {name!r}, which is not in compare.methods={methods}.")
    adding = pairs.strip().startswith("+")
    own = _extra_settings(pairs.strip().lstrip("+"), "per_method")
    settings = (shared + own) if adding else own
    if len(set(settings)) != len(settings):
      raise ConfigError(f"compare.grid.per_method: {name}'s grid names a setting twice (or one the shared grid has).")
    result.append((name, tuple(settings)))
  return result


def parse_grid(comparison: Comparison) -> Grid | None:
  """The grid of ``compare.grid`` (None when nothing is set: the plain comparison)."""
  config, compare = comparison.config, comparison.settings
  section = compare.grid
  rates = _values(section.learning_rate, float, "learning_rate")
  warmups = _values(section.warmup_steps, int, "warmup_steps")
  extra = _extra_settings(section.extra)
  if not rates and not warmups and not extra and not section.per_method.strip():
    return None
  if rates or warmups:  # one list alone varies around the config's own value of the other
    rates = rates or [float(config.train.learning_rate)]
    warmups = warmups or [int(config.train.warmup_steps)]
  steps = int(section.steps or config.train.steps)
  if not 0 < steps <= config.train.steps:
    raise ConfigError(f"compare.grid.steps={section.steps} must lie in [0, train.steps={config.train.steps}] "
                      f"(0: the full budget).")
  settings = [Setting(r, w) for r in rates for w in warmups] + extra
  if len(set(settings)) != len(settings):
    raise ConfigError(f"compare.grid.extra={section.extra!r} names a setting twice or one the cross product "
                      f"of learning_rate and warmup_steps already has.")
  methods = [m.strip() for m in compare.methods.split(",") if m.strip()]
  per_method = _per_method(section.per_method, settings, methods)
  if not settings:
    missing = [m for m in methods if m not in dict(per_method)]
    if missing:
      raise ConfigError(f"compare.grid has no shared setting and compare.grid.per_method gives none to {missing}; "
                        f"give them settings there or set compare.grid.learning_rate / warmup_steps.")
  for setting in dict.fromkeys([*settings, *(s for _, own in per_method for s in own)]):
    source = "extra's " if setting in extra else ""  # the key the user wrote the bad value under
    if setting.learning_rate <= 0:
      raise ConfigError(f"compare.grid.{source}learning_rate: {setting.learning_rate:g} must be positive.")
    if not 0 <= setting.warmup_steps < steps:
      raise ConfigError(f"compare.grid.{source}warmup_steps: {setting.warmup_steps} must lie in [0, {steps}) (the "
                        f"selection budget, compare.grid.steps or train.steps).")
  return Grid(tuple(settings), steps, tuple(per_method))


def setting_config(method_config: ml_collections.ConfigDict, setting: Setting, steps: int,
                   seed: int) -> ml_collections.ConfigDict:
  """The method's config at ``setting``, ``steps`` long (stage 1 scaled with it), seed ``seed``; validated."""
  config = ml_collections.ConfigDict(method_config.to_dict())
  train = config.train
  train.learning_rate, train.warmup_steps = float(setting.learning_rate), int(setting.warmup_steps)
  if steps != train.steps:
    train.stage1_steps = int(round(train.stage1_steps * steps / train.steps))
    train.eval_every = min(train.eval_every, steps)
    train.checkpoint_every = min(train.checkpoint_every, steps)
    train.steps = steps
  config.seed = seed
  validate_config(config)
  return config


def grid_relative(method: str, setting: Setting, grid: Grid, full_steps: int) -> str:
  suffix = "seed0" if grid.steps == full_steps else f"steps{grid.steps}_seed0"
  return f"{method}/{setting.name}/{suffix}"


def is_alive(summary: RunSummary) -> bool:
  """False when the health verdict finds a MoE layer of the run dead (a dense model is always alive). The runner
  re-judges every summary it loads (``runner.judged``), so runs finished before the verdict's rule are judged by
  it too."""
  health = summary.health or {}
  return not health.get("dead_layers")


def choose(cells: list[dict], rejected: tuple[str, ...] = (), diverged: tuple[str, ...] = ()) -> dict | None:
  """The finished grid cell with the lowest valid perplexity among the live ones whose setting is not in
  ``rejected`` (names of choices a seed died or diverged at); else the lowest of all that diverged neither in the
  grid nor in a seed (``diverged``: names of choices a seed diverged at), marked ``every_setting_dead``;
  ``{"every_setting_diverged": True}`` when none is left; None while the grid runs."""
  cells = [c for c in cells if c.get("in_grid", True)]
  finished = [c for c in cells if c.get("valid_ppl") is not None or c.get("diverged") is not None]
  if not finished or len(finished) < len(cells):
    return None
  trained = [c for c in finished if c.get("valid_ppl") is not None]
  alive = [c for c in trained if c["alive"] and c["setting"]["name"] not in rejected]
  pool = alive or [c for c in trained if c["setting"]["name"] not in diverged]
  if not pool:
    return {"every_setting_diverged": True}
  best = min(pool, key=lambda c: c["valid_ppl"])
  return {**best["setting"], "every_setting_dead": not alive}


def run_sweep(comparison: Comparison, workdir: str | pathlib.Path, log=print,
              train: bool = True) -> dict:
  """Runs (or, with ``train`` false, only collects) every method's grid and its seeds at the choice.

  Returns {"grid": {method: [cell, ...]}, "choices": {method: setting dict or None}, "records": [seeded run
  records, as runner.run_all's, each with its "setting"]}. A choice's "rejected" lists the earlier choices a seed
  died at: [{"learning_rate", "warmup_steps", "name", "dead_seeds", "valid_ppl": {seed: ppl}}]. A cell:
  {"setting", "valid_ppl", "test_ppl", "alive", "dead_layers", "contribution", "workdir", "status"} (valid_ppl
  None while unfinished). The choice reads ``valid_ppl`` only.
  """
  workdir = pathlib.Path(workdir)
  config, grid = comparison.config, parse_grid(comparison)
  if grid is None:
    raise ConfigError("the sweep needs compare.grid.learning_rate and/or compare.grid.warmup_steps.")
  configs = method_configs(comparison)
  seeds = comparison.settings.seeds
  full = config.train.steps
  plans = {}
  for name, method_config in configs.items():  # every run's config checked before the first run starts
    try:
      plans[name] = {s: setting_config(method_config, s, grid.steps, config.seed) for s in grid.for_method(name)}
      for s in grid.for_method(name):
        setting_config(method_config, s, full, config.seed)
    except ConfigError as error:
      raise ConfigError(f"method {name!r}: {error}") from error
  exported_root = runner.results_dir(comparison)
  total = sum((0 if grid.is_fixed(name) else len(grid.for_method(name))) + seeds for name in configs)
  progress = {"done": 0, "total": total}  # run counter of the log's "[k/n]" tags (a rejected choice adds seeds)
  result = {"grid": {}, "choices": {}, "records": [], "selection_steps": grid.steps,
            "settings": [s.as_dict() for s in grid.columns]}
  for name, method_config in configs.items():
    own = grid.for_method(name)
    if grid.is_fixed(name):  # one setting is no choice: no selection run, its seeds are the method's reported runs
      result["grid"][name] = [{"setting": s.as_dict(), "in_grid": s == own[0], "valid_ppl": None, "test_ppl": None,
                               "alive": None, "dead_layers": [], "status": "the method's one setting: not selected"}
                              for s in grid.columns]
      result["choices"][name] = {**own[0].as_dict(), "every_setting_dead": False, "fixed": True, "rejected": []}
      result["records"] += _seeded_runs(name, method_config, own[0], comparison, workdir, log, progress, exported_root,
                                        train, stop_at_dead=False)[0]
      continue
    cells = []
    for setting in grid.columns:
      if setting not in grid.for_method(name):
        cells.append({"setting": setting.as_dict(), "in_grid": False, "valid_ppl": None, "test_ppl": None,
                      "alive": None, "dead_layers": [], "status": "not in this method's grid"})
        continue
      relative = grid_relative(name, setting, grid, full)
      tag = f"{_count(progress)} {name} grid {setting.name}"
      cell = {"setting": setting.as_dict(), "valid_ppl": None, "test_ppl": None, "alive": None, "dead_layers": [],
              "workdir": str(workdir / relative), "status": "not run yet"}
      try:
        found = runner.train_run(plans[name][setting], workdir, relative, log, tag, exported_root, train)
      except runner.RunDiverged as diverged:
        log(f"{tag}: diverged at step {diverged.step}; not eligible", flush=True)
        cells.append({**cell, "diverged": diverged.step, "alive": False, "workdir": str(diverged.source),
                      "status": f"diverged at step {diverged.step}"})
        continue
      if found is not None:
        summary, source, status = found
        runner.log_result(log, tag, status, summary)
        cell.update(valid_ppl=summary.valid["perplexity"], test_ppl=summary.test["perplexity"],
                    alive=is_alive(summary), dead_layers=(summary.health or {}).get("dead_layers", []),
                    contribution=health_lib.least_contribution(summary.health or {}),
                    workdir=str(source), status=status)
        if (summary.health or {}).get("weak_layers"):  # > 1 MoE layer: under the line, another works
          cell["weak_layers"] = summary.health["weak_layers"]
      cells.append(cell)
    result["grid"][name] = cells
    rejected: list[dict] = []
    while True:
      choice = choose(cells, tuple(r["name"] for r in rejected),
                      tuple(r["name"] for r in rejected if r.get("diverged_seeds")))
      result["choices"][name] = choice and {**choice, "rejected": rejected}
      if choice is None:
        log(f"{name}: the grid is not finished; no choice and no seeds yet.", flush=True)
        break
      if choice.get("every_setting_diverged"):
        log(f"{name}: every setting diverged (or was rejected); no choice and no seeds.", flush=True)
        break
      chosen = next(s for s in grid.for_method(name) if s.name == choice["name"])
      log(f"{name}: chose {chosen.name} (valid ppl "
          f"{next(c['valid_ppl'] for c in cells if c['setting']['name'] == chosen.name):.2f}"
          f"{', every setting dead' if choice['every_setting_dead'] else ''})", flush=True)
      records, diverged = _seeded_runs(name, method_config, chosen, comparison, workdir, log, progress,
                                       exported_root, train, stop_at_dead=not choice["every_setting_dead"])
      dead_seeds = [r["seed"] for r in records if not is_alive(r["summary"])]
      if (dead_seeds or diverged) and not choice["every_setting_dead"]:
        why = "; ".join([f"the layer died in seed(s) {dead_seeds}"] * bool(dead_seeds)
                        + [f"seed {k} diverged at step {step}" for k, step in diverged.items()])
        log(f"{name}: {chosen.name} rejected: {why}; choosing again.", flush=True)
        progress["total"] += len(records) + len(diverged)  # the new choice's seeds; the rejected one's stopped
        rejected.append({**chosen.as_dict(), "dead_seeds": dead_seeds, "diverged_seeds": diverged,
                         "valid_ppl": {r["seed"]: r["summary"].valid["perplexity"] for r in records}})
        continue
      result["records"] += records
      break
  return result


def _count(progress: dict) -> str:
  progress["done"] += 1
  return f"[{progress['done']}/{progress['total']}]"


def _seeded_runs(name: str, method_config, chosen: Setting, comparison: Comparison, workdir, log,
                 progress: dict, exported_root, train: bool, stop_at_dead: bool) -> tuple[list[dict], dict]:
  """The finished reported runs at ``chosen`` (seeds ``config.seed + 1`` ... ``+ compare.seeds``; trained here
  unless finished, ``train`` false or locked), in seed order, each a record for the report with its "setting";
  and {seed: step} of the one that diverged. With ``stop_at_dead``, stops at the first run whose layer the verdict
  finds dead or that diverged (the choice will be rejected, its other seeds are not needed); without it (no other
  choice is left), a diverged seed stops the sweep (RunDiverged)."""
  config = comparison.config
  full = config.train.steps
  costs, records = None, []
  for k in range(1, comparison.settings.seeds + 1):
    run_config = setting_config(method_config, chosen, full, config.seed + k)
    relative = f"{name}/{chosen.name}/seed{k}"
    tag = f"{_count(progress)} {name} {chosen.name} seed {k}"
    try:
      found = runner.train_run(run_config, workdir, relative, log, tag, exported_root, train)
    except runner.RunDiverged as diverged:
      if not stop_at_dead:
        raise
      log(f"{tag}: diverged at step {diverged.step}", flush=True)
      return records, {run_config.seed: diverged.step}
    if found is None:
      continue
    summary, source, status = found
    runner.log_result(log, tag, status, summary)
    if costs is None:
      costs = runner.model_costs(run_config, workdir / relative)
    record = runner.run_record(name, run_config, k, source, summary, costs)
    record["setting"] = chosen.as_dict()
    records.append(record)
    if stop_at_dead and not is_alive(summary):
      break
  return records, {}

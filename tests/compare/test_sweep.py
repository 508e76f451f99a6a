"""The tuned comparison (compare/sweep.py): the grid, the choice on validation among live runs, seeds at the choice,
resumption (in DIR and from a committed results folder), the report. Training is replaced by a fake that writes a
summary from the setting, so the logic is checked in seconds; one slow test trains the tiny config for real."""
from __future__ import annotations

import fcntl
import json
import math

import ml_collections
import pytest
from tests.conftest import REPO, share_prepared_ptb

from stablemoe_jax.compare import report, runner, sweep, sweep_report
from stablemoe_jax.compare.methods import method_configs, parse_method_names
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.core.errors import NonFiniteLossError
from stablemoe_jax.experiment.config_validation import ConfigError
from stablemoe_jax.compare.comparison import Comparison


def _sweep_config(tiny_config, methods="dense,stablemoe_all", seeds=2, rates="3e-3,1e-2", warmups="2,4",
                  steps=0):
  config = ml_collections.ConfigDict(tiny_config.to_dict())
  config.compare = ml_collections.ConfigDict({
      "methods": methods, "seeds": seeds, "results_dir": "", "report_only": False,
      "grid": {"learning_rate": rates, "warmup_steps": warmups, "steps": steps}})
  return config


def _fake_valid(config) -> float:
  """A made-up validation perplexity: best at lr 1e-2 / warmup 2 for dense, lr 3e-3 / warmup 4 for StableMoE."""
  lr, warmup = config.train.learning_rate, config.train.warmup_steps
  if config.model.moe.enabled:
    return 100 + 1000 * abs(lr - 3e-3) + abs(warmup - 4) + config.seed
  return 100 + 1000 * abs(lr - 1e-2) + abs(warmup - 2) + config.seed


class _Trained(list):
  """The fake's (workdir, steps, stage1_steps, seed) per run; ``dead`` adds (lr, warmup, seed) StableMoE runs whose
  layer dies; ``diverge`` (moe, lr, warmup, seed) runs that stop on a NaN gradient at step 7."""
  dead: set
  diverge: set


@pytest.fixture
def fake_training(monkeypatch):
  """Replaces training by writing a summary; the StableMoE run at lr 3e-3 / warmup 4 (its best) is dead."""
  trained = _Trained()
  trained.dead, trained.diverge = set(), set()

  def train_and_evaluate(config, workdir):
    trained.append((str(workdir), config.train.steps, config.train.stage1_steps, config.seed))
    if (config.model.moe.enabled, config.train.learning_rate, config.train.warmup_steps,
        config.seed) in trained.diverge:
      (workdir / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 4.0}) + "\n")
      raise NonFiniteLossError("the gradient norm is nan at step 7", step=7)
    valid = _fake_valid(config)
    lr, warmup = config.train.learning_rate, config.train.warmup_steps
    dead = ["moe_2"] if config.model.moe.enabled and ((lr, warmup) == (3e-3, 4)
                                                      or (lr, warmup, config.seed) in trained.dead) else []
    # Dead by the verdict's contribution rule: removing the layer costs 0.2% of valid PPL (alive ones: 5%). The
    # summary's own dead_layers says the opposite, as an old guard's might: the runner re-judges every summary.
    worth = {"moe_2": {"relative_perplexity_increase": 0.002 if dead else 0.05}} if config.model.moe.enabled else {}
    # Test perplexity runs the other way from validation: a choice that read it would pick the worst cell.
    summary = {"steps": config.train.steps, "stage1_steps": config.train.stage1_steps, "train_seconds": 1.0,
               "tokens_per_second": 10.0, "distill_agreement_at_boundary": None,
               "valid": {"perplexity": valid, "loss": math.log(valid)},
               "test": {"perplexity": 1000 - valid, "loss": math.log(1000 - valid)},
               "health": {"ok": bool(dead), "dead_layers": [] if dead else ["moe_2"], "layers": {},
                          "contribution": {"layers": worth}}}
    if config.seed != 1:  # seed 1 stands for a run from before summaries recorded their device
      summary["device"] = {"platform": "gpu", "kind": "NVIDIA H100 80GB HBM3", "count": 1, "processes": 1}
    (workdir / "summary.json").write_text(json.dumps(summary))
    (workdir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    return RunSummary.from_json(summary)

  monkeypatch.setattr(runner.loop, "train_and_evaluate", train_and_evaluate)
  monkeypatch.setattr(runner, "model_costs", lambda config, directory: {
      "shared_params": 1, "expert_params": 2 * config.model.moe.enabled, "total_params": 3, "flops_per_token": 4})
  return trained


def test_grid_choice_seeds_resume_and_report(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config)
  lines = []
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: lines.append(line))
  # 2 methods x 4 settings (seed 0, which chooses), then the reported seeds 1 and 2 at each choice.
  assert len(fake_training) == 2 * 4 + 2 * 2
  # The lowest validation PPL; test PPL runs the other way, so a choice that read it would be 3e-3 / 4.
  assert result["choices"]["dense"]["name"] == "lr0.01_warmup2"
  # StableMoE's best setting died, so it is not eligible: the next best live one is chosen.
  stable_cells = {c["setting"]["name"]: c for c in result["grid"]["stablemoe_all"]}
  assert not stable_cells["lr0.003_warmup4"]["alive"]
  live = {n: c["valid_ppl"] for n, c in stable_cells.items() if c["alive"]}
  assert result["choices"]["stablemoe_all"]["name"] == min(live, key=live.get) == "lr0.003_warmup2"
  assert not result["choices"]["stablemoe_all"]["every_setting_dead"]
  # The reported seeds at the choice, under the full budget: config.seed + 1 and + 2, never the choosing seed 0.
  seeded = [(r["method"], r["seed"], r["setting"]["name"]) for r in result["records"]]
  assert seeded == [("dense", 1, "lr0.01_warmup2"), ("dense", 2, "lr0.01_warmup2"),
                    ("stablemoe_all", 1, "lr0.003_warmup2"), ("stablemoe_all", 2, "lr0.003_warmup2")]
  assert (tmp_path / "dense" / "lr0.01_warmup2" / "seed1" / "summary.json").exists()
  assert all(steps == config.train.steps for _, steps, _, _ in fake_training)

  rows = sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  table = (tmp_path / "comparison.md").read_text()
  assert "| lr 0.003, warmup 2 | lr 0.003, warmup 4 |" in table
  assert f"{stable_cells['lr0.003_warmup4']['valid_ppl']:.2f} +0.2% DEAD" in table
  assert f"{stable_cells['lr0.003_warmup2']['valid_ppl']:.2f} +5.0% |" in table
  assert "diverged" not in table  # said only where a run diverged
  dense_line = next(line for line in table.splitlines() if line.startswith("| dense"))
  assert dense_line.endswith("| lr 0.01, warmup 2 |")  # its choice cell
  dense = rows[0]
  assert dense["valid_ppl"] == [_fake_valid_at(config, 1e-2, 2, 1, False), _fake_valid_at(config, 1e-2, 2, 2, False)]
  assert f"{dense['valid_ppl_mean']:.2f} ± {dense['valid_ppl_std']:.2f}" in table
  # Paired against dense: StableMoE's seeds minus dense's, seed by seed (the fake's seed offsets cancel).
  gap = _fake_valid_at(config, 3e-3, 2, 1, True) - _fake_valid_at(config, 1e-2, 2, 1, False)
  assert f"| 1, 2 | {gap:+.2f} [{gap:+.2f}, {gap:+.2f}] |" in table
  # Seeds 2 on the "GPU", each method's seed 1 unrecorded; rows count the reported runs only.
  assert ("Trained on: 1 x NVIDIA H100 80GB HBM3 (2 runs), unrecorded (2 runs). The speed columns mix devices"
          in table)
  saved = json.loads((tmp_path / "comparison.json").read_text())
  assert saved["choices"]["dense"]["name"] == "lr0.01_warmup2" and len(saved["grid"]["stablemoe_all"]) == 4

  # Rerun: nothing is trained again, the same result.
  fake_training.clear()
  again = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None)
  assert not fake_training and again["choices"] == result["choices"]
  assert [r["summary"] for r in again["records"]] == [r["summary"] for r in result["records"]]


def test_a_choice_whose_seed_dies_gives_way_to_the_next_live_setting(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="stablemoe_all", seeds=3)
  fake_training.dead = {(3e-3, 2, 1)}  # the choice's seed 1 dies; its seed 2 is then not needed
  lines = []
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: lines.append(line))
  # Live grid cells by valid PPL: 3e-3 / 2 (chosen, then rejected), 1e-2 / 4, 1e-2 / 2.
  choice = result["choices"]["stablemoe_all"]
  assert choice["name"] == "lr0.01_warmup4" and not choice["every_setting_dead"]
  assert choice["rejected"] == [{"learning_rate": 3e-3, "warmup_steps": 2, "name": "lr0.003_warmup2",
                                 "dead_seeds": [1], "diverged_seeds": {},
                                 "valid_ppl": {1: _fake_valid_at(config, 3e-3, 2, 1, True)}}]
  assert not (tmp_path / "stablemoe_all" / "lr0.003_warmup2" / "seed2").exists()
  assert [(r["seed"], r["setting"]["name"]) for r in result["records"]] == [
      (1, "lr0.01_warmup4"), (2, "lr0.01_warmup4"), (3, "lr0.01_warmup4")]
  assert len(fake_training) == 4 + 1 + 3  # the grid, the rejected choice's seed 1, the new choice's seeds 1-3
  assert any("lr0.003_warmup2 rejected: the layer died in seed(s) [1]" in line for line in lines)
  assert lines[-1].startswith("[8/8] stablemoe_all lr0.01_warmup4 seed 3")  # the count grew by the new seeds

  sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  table = (tmp_path / "comparison.md").read_text()
  assert f"{_fake_valid_at(config, 3e-3, 2, 0, True):.2f} +5.0% (DEAD in seed 1)" in table
  assert (f"- StableMoE, balance loss over all tokens (all): lr 0.003, warmup 2 rejected (seed 1: "
          f"{_fake_valid_at(config, 3e-3, 2, 1, True):.2f} (DEAD)).") in table
  # Resumed: the same choice without training anything.
  fake_training.clear()
  again = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None)
  assert not fake_training and again["choices"] == result["choices"]


def test_when_every_live_choice_dies_in_a_seed_the_best_of_all_is_marked(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="stablemoe_all", seeds=2, rates="3e-3", warmups="2,4")
  fake_training.dead = {(3e-3, 2, 1)}  # the one live setting dies in seed 1; 3e-3 / 4 died in the grid
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None)
  choice = result["choices"]["stablemoe_all"]
  assert choice["every_setting_dead"] and choice["name"] == "lr0.003_warmup4"  # the lowest valid PPL of all
  assert [r["name"] for r in choice["rejected"]] == ["lr0.003_warmup2"]
  # Its seeds are reported, dead as they are, not rejected in turn.
  assert [(r["seed"], r["summary"].health["dead_layers"]) for r in result["records"]] == [(1, ["moe_2"]),
                                                                                              (2, ["moe_2"])]


def test_a_diverged_grid_setting_is_not_eligible_and_is_not_trained_again(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="dense", seeds=1, rates="3e-3,1e-2", warmups="2,4")
  config.compare.results_dir = str(tmp_path / "results")
  fake_training.diverge = {(False, 1e-2, 2, 0)}  # dense's best setting diverges in the grid
  lines = []
  result = sweep.run_sweep(Comparison.of(config), tmp_path / "runs", log=lambda line, **_: lines.append(line))
  cells = {c["setting"]["name"]: c for c in result["grid"]["dense"]}
  assert cells["lr0.01_warmup2"]["diverged"] == 7 and cells["lr0.01_warmup2"]["valid_ppl"] is None
  # The next best by valid PPL (100 + 1000 |lr - 1e-2| + |warmup - 2|): lr 1e-2 / warmup 4 at 102.
  assert result["choices"]["dense"]["name"] == "lr0.01_warmup4"
  assert [(r["seed"], r["setting"]["name"]) for r in result["records"]] == [(1, "lr0.01_warmup4")]
  assert any("dense grid lr0.01_warmup2: diverged at step 7; not eligible" in line for line in lines)
  for folder in (tmp_path / "runs", tmp_path / "results"):  # recorded in the run and in the results folder
    record = json.loads((folder / "dense" / "lr0.01_warmup2" / "seed0" / runner.DIVERGED_FILE).read_text())
    assert record == {"step": 7, "message": "the gradient norm is nan at step 7"}
  assert (tmp_path / "results" / "dense" / "lr0.01_warmup2" / "seed0" / "metrics.jsonl").exists()
  sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  table = (tmp_path / "comparison.md").read_text()
  assert ("| dense Transformer (same shared layers) | 107.00 | 109.00 | diverged at step 7 | 102.00 | lr 0.01, "
          "warmup 4 |") in table
  assert "(diverged) makes its setting ineligible" in table
  # Neither a rerun nor a new machine with only the results folder trains it again.
  fake_training.clear()
  again = sweep.run_sweep(Comparison.of(config), tmp_path / "runs", log=lambda line, **_: None)
  elsewhere = sweep.run_sweep(Comparison.of(config), tmp_path / "machine2", log=lambda line, **_: None)
  assert not fake_training and again["choices"] == elsewhere["choices"] == result["choices"]
  # A plain comparison (no grid to choose from) stops on it, saying where and how to train it again.
  with pytest.raises(runner.RunDiverged, match=r"diverged: the gradient norm is nan at step 7 \(to train it "
                                                r"again from its last checkpoint, remove its diverged.json"):
    runner.train_run(config, tmp_path / "runs", "dense/lr0.01_warmup2/seed0", lambda *a, **k: None, "tag")


def test_a_choice_whose_seed_diverges_is_rejected_and_not_a_fallback(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="stablemoe_all", seeds=3)
  fake_training.diverge = {(True, 3e-3, 2, 2)}  # the choice's seed 2 diverges; seed 3 is then not needed
  lines = []
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: lines.append(line))
  choice = result["choices"]["stablemoe_all"]
  assert choice["name"] == "lr0.01_warmup4" and not choice["every_setting_dead"]
  assert choice["rejected"] == [{"learning_rate": 3e-3, "warmup_steps": 2, "name": "lr0.003_warmup2",
                                 "dead_seeds": [], "diverged_seeds": {2: 7},
                                 "valid_ppl": {1: _fake_valid_at(config, 3e-3, 2, 1, True)}}]
  assert any("lr0.003_warmup2 rejected: seed 2 diverged at step 7; choosing again" in line for line in lines)
  assert not (tmp_path / "stablemoe_all" / "lr0.003_warmup2" / "seed3").exists()
  assert lines[-1].startswith("[9/9] stablemoe_all lr0.01_warmup4 seed 3")  # 4 grid + 2 rejected's + 3
  sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  table = (tmp_path / "comparison.md").read_text()
  assert f"{_fake_valid_at(config, 3e-3, 2, 0, True):.2f} +5.0% (diverged in seed 2 at step 7)" in table
  assert (f"lr 0.003, warmup 2 rejected (seed 1: {_fake_valid_at(config, 3e-3, 2, 1, True):.2f}, seed 2: "
          "diverged at step 7).") in table
  # Where every live setting is rejected, the fallback of "every setting dead" leaves out the diverged choice.
  cells = [{"setting": {"name": n}, "valid_ppl": v, "alive": alive}
           for n, v, alive in (("a", 98.0, True), ("b", 101.0, False), ("c", 99.0, False))]
  assert sweep.choose(cells, rejected=("a",))["name"] == "a"  # died in a seed: still the best of all
  assert sweep.choose(cells, rejected=("a",), diverged=("a",))["name"] == "c"
  assert sweep.choose(cells, rejected=("a", "c"), diverged=("a", "c"))["name"] == "b"
  assert sweep.choose(cells[:1], rejected=("a",), diverged=("a",)) == {"every_setting_diverged": True}


def test_a_method_whose_every_setting_diverges_gets_no_choice(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="dense", seeds=1, rates="1e-2", warmups="2,4")
  fake_training.diverge = {(False, 1e-2, 2, 0), (False, 1e-2, 4, 0)}
  lines = []
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: lines.append(line))
  assert result["choices"]["dense"] == {"every_setting_diverged": True, "rejected": []} and not result["records"]
  assert "dense: every setting diverged (or was rejected); no choice and no seeds." in lines
  sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  assert ("| diverged at step 7 | diverged at step 7 | none: every setting diverged |"
          in (tmp_path / "comparison.md").read_text())


def _fake_valid_at(config, lr, warmup, seed, moe):
  c = ml_collections.ConfigDict(config.to_dict())
  c.train.learning_rate, c.train.warmup_steps, c.seed, c.model.moe.enabled = lr, warmup, seed, moe
  return _fake_valid(c)


def test_results_folder_carries_the_sweep_to_a_new_machine(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="dense", seeds=2, rates="3e-3,1e-2", warmups="2")
  config.compare.results_dir = str(tmp_path / "results")
  first = sweep.run_sweep(Comparison.of(config), tmp_path / "machine1", log=lambda line, **_: None)
  assert len(fake_training) == 4  # 2 grid runs, seeds 1-2 at the choice
  exported = tmp_path / "results" / "dense" / "lr0.01_warmup2" / "seed1"
  assert sorted(p.name for p in exported.iterdir()) == ["metrics.jsonl", "summary.json"]
  # A new machine: an empty workdir; only the committed results folder.
  fake_training.clear()
  lines = []
  second = sweep.run_sweep(Comparison.of(config), tmp_path / "machine2", log=lambda line, **_: lines.append(line))
  assert not fake_training and second["choices"] == first["choices"]
  assert [r["summary"] for r in second["records"]] == [r["summary"] for r in first["records"]]
  assert any(f"finished earlier ({tmp_path / 'results'}" in line for line in lines)


def test_report_only_trains_nothing_and_reports_an_unfinished_grid(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="dense", seeds=1, rates="3e-3,1e-2", warmups="2")
  sweep.run_sweep(Comparison.of(ml_collections.ConfigDict({**config.to_dict(), "compare": {
      **config.compare.to_dict(), "grid": {"learning_rate": "3e-3", "warmup_steps": "2", "steps": 0}}})),
      tmp_path, log=lambda line, **_: None)  # only the first setting of the grid below has run
  fake_training.clear()
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None, train=False)
  assert not fake_training and result["choices"]["dense"] is None and not result["records"]
  sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  table = (tmp_path / "comparison.md").read_text()
  assert "| dense Transformer (same shared layers) | 107.00 | -- | grid not finished |" in table


def test_a_run_another_process_is_training_is_skipped_not_trained_twice(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="dense", seeds=1, rates="3e-3,1e-2", warmups="2")
  busy = tmp_path / "dense" / "lr0.003_warmup2" / "seed0"
  busy.mkdir(parents=True)
  with open(busy / runner.LOCK_FILE, "a") as handle:  # another comparison command holds this run
    fcntl.flock(handle, fcntl.LOCK_EX)
    lines = []
    result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: lines.append(line))
    fcntl.flock(handle, fcntl.LOCK_UN)
  assert [t[0] for t in fake_training] == [str(tmp_path / "dense" / "lr0.01_warmup2" / "seed0")]
  assert any("another process is training it" in line for line in lines) and result["choices"]["dense"] is None
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None)  # released: now it trains
  assert len(fake_training) == 3 and result["choices"]["dense"]["name"] == "lr0.01_warmup2"  # and seed 1


def test_shorter_selection_budget_scales_stage1_and_reports_seeds_at_full_budget(tiny_config, tmp_path,
                                                                               fake_training):
  config = _sweep_config(tiny_config, methods="stablemoe_all", seeds=1, rates="3e-3", warmups="2", steps=6)
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None)
  (grid_dir, grid_steps, grid_stage1, _), (seed_dir, seed_steps, seed_stage1, _) = fake_training
  assert grid_dir.endswith("stablemoe_all/lr0.003_warmup2/steps6_seed0") and (grid_steps, grid_stage1) == (6, 2)
  assert seed_dir.endswith("stablemoe_all/lr0.003_warmup2/seed1") and (seed_steps, seed_stage1) == (12, 5)
  assert result["records"][0]["summary"].steps == 12


@pytest.mark.parametrize("grid, message", [
    ({"learning_rate": "1e-3,x"}, "'x' is not a number"),
    ({"learning_rate": "1e-3,1e-3"}, "names a value twice"),
    ({"warmup_steps": "2.5"}, "is not a whole number"),
    ({"warmup_steps": "20"}, "warmup_steps: 20 must lie in"),
    ({"learning_rate": "-1"}, "must be positive"),
    ({"learning_rate": "1e-3", "steps": 99}, "compare.grid.steps=99 must lie in"),
    ({"extra": "6e-3:400"}, "'6e-3:400' is not LR/WARMUP"),
    ({"learning_rate": "1e-3", "warmup_steps": "2", "extra": "1e-3/2"}, "names a setting twice"),
    ({"extra": "1e-3/20"}, "compare.grid.extra's warmup_steps: 20 must lie in"),
])
def test_bad_grids_are_one_clear_error_before_any_training(tiny_config, tmp_path, fake_training, grid, message):
  config = _sweep_config(tiny_config, rates="", warmups="")
  for key, value in grid.items():
    config.compare.grid[key] = value
  with pytest.raises(ConfigError, match=message):
    sweep.run_sweep(Comparison.of(config), tmp_path)
  assert not fake_training


def test_tune_cpu_preset_validates_every_method_and_setting():
  from configs import tune_cpu  # pylint: disable=import-outside-toplevel
  config = tune_cpu.get_config()
  grid = sweep.parse_grid(Comparison.of(config))
  assert len(grid.settings) == 11 and grid.steps == config.train.steps == 850
  for name, method_config in method_configs(Comparison.of(config)).items():
    for setting in grid.settings:
      assert sweep.setting_config(method_config, setting, grid.steps, 0).train.learning_rate == setting.learning_rate


def test_tune_routers_preset_adds_three_methods_and_reuses_the_tuned_tables_runs():
  """configs/tune_routers_cpu.py trains only its new methods: every other method keeps tune_cpu's grid, and each of
  that grid's seed-0 runs and each choice's seeds 1-3 is committed in results/tune_h100, so the sweep finds them."""
  from configs import tune_cpu, tune_routers_cpu  # pylint: disable=import-outside-toplevel
  config, tuned = tune_routers_cpu.get_config(), tune_cpu.get_config()
  grid, tuned_grid = sweep.parse_grid(Comparison.of(config)), sweep.parse_grid(Comparison.of(tuned))
  configs = method_configs(Comparison.of(config))
  old = [name for name in configs if name not in tune_routers_cpu.NEW_METHODS]
  assert old == parse_method_names(tuned.compare.methods)
  results = REPO / tuned.compare.results_dir
  choices = json.loads((results / "comparison.json").read_text())["choices"]
  for name in old:
    assert grid.for_method(name) == tuned_grid.for_method(name)
    for setting in grid.for_method(name):
      assert (results / name / setting.name / "seed0" / "summary.json").is_file(), (name, setting.name)
    for seed in (1, 2, 3):
      assert (results / name / choices[name]["name"] / f"seed{seed}" / "summary.json").is_file(), (name, seed)
  for name in tune_routers_cpu.NEW_METHODS:
    assert [(s.learning_rate, s.warmup_steps) for s in grid.for_method(name)] == [(6e-3, 400), (4e-3, 400)]
    for setting in grid.for_method(name):
      run = sweep.setting_config(configs[name], setting, grid.steps, 0)
      assert (run.train.learning_rate, run.train.steps, run.train.stage1_steps) == (setting.learning_rate, 850, 300)
  assert configs["switch_top2"].model.moe.switch.top_k == 2
  assert (configs["deepseek"].model.moe.deepseek.top_k, configs["deepseek"].model.moe.shared_experts) == (2, 0)
  assert configs["deepseek_shared"].model.moe.shared_experts == 1


def test_extra_settings_extend_the_cross_product(tiny_config):
  config = _sweep_config(tiny_config, rates="1e-3,2e-3", warmups="2")
  config.compare.grid.extra = "4e-3/2, 4e-3/4"
  names = [s.name for s in sweep.parse_grid(Comparison.of(config)).settings]
  assert names == ["lr0.001_warmup2", "lr0.002_warmup2", "lr0.004_warmup2", "lr0.004_warmup4"]
  config.compare.grid.learning_rate = config.compare.grid.warmup_steps = ""
  assert [s.name for s in sweep.parse_grid(Comparison.of(config)).settings] == names[2:]


def test_no_grid_is_the_plain_comparison(tiny_config):
  assert sweep.parse_grid(Comparison.of(_sweep_config(tiny_config, rates="", warmups=""))) is None


@pytest.mark.slow
def test_tiny_sweep_trains_for_real(tiny_config, prepared_ptb, tmp_path):
  share_prepared_ptb(prepared_ptb, tmp_path)  # the sweep's runs share workdir/data: the session's prepared corpus
  config = _sweep_config(tiny_config, methods="stablemoe_all", seeds=1, rates="3e-3,1e-2", warmups="2")
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None)
  cells = result["grid"]["stablemoe_all"]
  live = [c for c in cells if c["alive"]] or cells
  best = min(live, key=lambda c: c["valid_ppl"])
  assert result["choices"]["stablemoe_all"]["name"] == best["setting"]["name"]
  assert [r["seed"] for r in result["records"]] == [1]  # reported: a seed the choice never saw
  assert result["records"][0]["summary"].valid["perplexity"] != best["valid_ppl"]
  rows = sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  assert rows[0]["health"] is not None and (tmp_path / "convergence.png").exists()
  assert (tmp_path / "validation_tokens.png").read_bytes()[:4] == b"\x89PNG"
  assert result["records"][0]["summary"].device == {"platform": "cpu", "kind": "cpu", "count": 1, "processes": 1}
  assert "Trained on: 1 x cpu (1 run).\n" in (tmp_path / "comparison.md").read_text()


def test_report_only_without_a_grid_trains_nothing_either(tiny_config, tmp_path, fake_training):
  """The plain comparison (no grid) with compare.report_only: only finished runs, nothing trained."""
  config = _sweep_config(tiny_config, methods="dense,stablemoe_all", seeds=2, rates="", warmups="")
  runner.train_run(method_configs(Comparison.of(config))["dense"], tmp_path, "dense/seed0", lambda *a, **k: None, "tag")
  fake_training.clear()
  records = runner.run_all(Comparison.of(config), tmp_path, log=lambda line, **_: None, train=False)
  assert not fake_training and [(r["method"], r["seed"]) for r in records] == [("dense", 0)]


def test_a_method_grid_of_its_own_and_one_extended_past_the_shared_grid(tiny_config, tmp_path, fake_training):
  config = _sweep_config(tiny_config, methods="dense,stablemoe_all", seeds=1, rates="3e-3", warmups="2")
  config.compare.grid.per_method = "dense=1e-2/2, 1e-2/4; stablemoe_all=+3e-3/4"
  grid = sweep.parse_grid(Comparison.of(config))
  assert [s.name for s in grid.for_method("dense")] == ["lr0.01_warmup2", "lr0.01_warmup4"]
  assert [s.name for s in grid.for_method("stablemoe_all")] == ["lr0.003_warmup2", "lr0.003_warmup4"]
  assert [s.name for s in grid.columns] == ["lr0.003_warmup2", "lr0.01_warmup2", "lr0.01_warmup4", "lr0.003_warmup4"]
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None)
  assert len(fake_training) == 2 + 2 + 2  # each method's own two settings, one reported seed each
  assert result["choices"]["dense"]["name"] == "lr0.01_warmup2"  # not the shared 3e-3 / 2 it never ran
  assert result["choices"]["stablemoe_all"]["name"] == "lr0.003_warmup2"  # 3e-3 / 4 is dead (the fake)
  sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  dense_line = next(line for line in (tmp_path / "comparison.md").read_text().splitlines()
                    if line.startswith("| dense"))
  assert dense_line.startswith("| dense Transformer (same shared layers) | · |") and dense_line.endswith("| · | lr 0.01, warmup 2 |")
  for bad, message in (("switch=1e-3/2", "names 'switch', which is not in compare.methods"),
                       ("dense", "is not METHOD=LR/W"), ("dense=+3e-3/2", "names a setting twice")):
    config.compare.grid.per_method = bad
    with pytest.raises(ConfigError, match=message):
      sweep.parse_grid(Comparison.of(config))


def test_a_method_with_one_setting_trains_no_selection_run_and_pairs_with_its_baseline(tiny_config, tmp_path,
                                                                                       fake_training):
  """configs/ablate_cpu.py's shape: each method at one fixed setting, its seeds reported, an ablation paired with
  the method it ablates."""
  config = _sweep_config(tiny_config, methods="stablemoe_all,stablemoe_assigned", seeds=2, rates="", warmups="")
  config.compare.grid.per_method = "stablemoe_all=3e-3/2;stablemoe_assigned=3e-3/2"
  config.compare.pairs = "stablemoe_assigned:stablemoe_all"
  config.compare.contrasts = "stablemoe_all:stablemoe_assigned"  # beside the pairing, the other way round
  result = sweep.run_sweep(Comparison.of(config), tmp_path, log=lambda line, **_: None)
  assert sorted(seed for *_, seed in fake_training) == [1, 1, 2, 2]  # no seed-0 selection run
  assert result["choices"]["stablemoe_all"]["fixed"] and result["choices"]["stablemoe_all"]["name"] == "lr0.003_warmup2"
  sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  table = (tmp_path / "comparison.md").read_text()
  assert "## Paired against its baseline" in table and "| its setting | lr 0.003, warmup 2 (its one setting) |" in table
  line = next(l for l in table.splitlines() if l.startswith("| StableMoE, the paper's balance loss (assigned) | "
                                                            "StableMoE, balance loss over all tokens (all) |"))
  assert "| 1, 2 | +0.00 [+0.00, +0.00] |" in line  # the fake's valid PPL depends on the setting, not the method
  contrasts = table[table.index("## Contrasts"):]
  assert ("| StableMoE, balance loss over all tokens (all) | StableMoE, the paper's balance loss (assigned) | 1, 2 |"
          in contrasts)
  config.compare.contrasts = ""
  sweep_report.write_sweep_reports(Comparison.of(config), result, tmp_path)
  assert "## Contrasts" not in (tmp_path / "comparison.md").read_text()
  config.compare.pairs = "stablemoe_assigned:dense"
  with pytest.raises(ConfigError, match="must be METHOD:BASELINE with both in compare.methods"):
    report.pairs_of(Comparison.of(config))
  config.compare.grid.per_method = "stablemoe_all=3e-3/2"
  with pytest.raises(ConfigError, match=r"gives none to \['stablemoe_assigned'\]"):
    sweep.parse_grid(Comparison.of(config))


def test_the_ablation_preset_shares_the_tuned_runs_and_ablates_stage_1():
  from configs import ablate_cpu  # pylint: disable=import-outside-toplevel
  config = ablate_cpu.get_config()
  configs = method_configs(Comparison.of(config))
  grid = sweep.parse_grid(Comparison.of(config))
  assert {name: [s.name for s in grid.for_method(name)] for name in configs} == {
      "base": ["lr0.004_warmup400"], "base_fixed": ["lr0.004_warmup400"],
      "stablemoe_cosine": ["lr0.006_warmup400"], "stablemoe_cosine_stage1_only": ["lr0.006_warmup400"]}
  stage1_only = configs["stablemoe_cosine_stage1_only"]
  assert stage1_only.train.stage1_steps == stage1_only.train.steps == 850
  assert configs["stablemoe_cosine"].train.stage1_steps == 300 and configs["base_fixed"].model.moe.base.fixed_routing
  assert config.compare.results_dir == "results/tune_h100"  # BASE's and StableMoE's seeds are the sweep's runs


def test_the_xmoe_preset_tunes_xmoe_on_seed_0_and_pairs_it_with_the_defaults_routing():
  from configs import xmoe_cpu  # pylint: disable=import-outside-toplevel
  config = xmoe_cpu.get_config()
  configs = method_configs(Comparison.of(config))
  grid = sweep.parse_grid(Comparison.of(config))
  assert grid.is_fixed("stablemoe_cosine") and not grid.is_fixed("stablemoe_xmoe")
  assert [s.name for s in grid.for_method("stablemoe_xmoe")] == [
      "lr0.004_warmup400", "lr0.006_warmup400", "lr0.008_warmup400"]
  xmoe, cosine = configs["stablemoe_xmoe"].model.moe.stablemoe, configs["stablemoe_cosine"].model.moe.stablemoe
  assert (xmoe.cosine_expert_norm, cosine.cosine_expert_norm) == (1.5, 0.0)
  assert xmoe.to_dict() | {"cosine_expert_norm": 0.0} == cosine.to_dict()  # the expert norm is the only difference
  assert report.pairs_of(Comparison.of(config)) == {"stablemoe_xmoe": "stablemoe_cosine"}
  assert config.compare.results_dir == "results/tune_h100"  # StableMoE-cosine's seeds are the sweep's runs


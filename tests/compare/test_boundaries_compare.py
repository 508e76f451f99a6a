"""The comparison's rules at their edges (issue 51): the paired interval and its plain-words reading (both bounds,
intervals across 0, non-zero width), the pairs and the grid's parsing at their bounds, the stage-1 length of a
shorter selection budget (rounded), the choice among live settings, and the runner's re-judging of a finished run
from its own metrics.jsonl. Pure functions and hand-written run folders: no training (about 2 s)."""
from __future__ import annotations

import json
import math

import ml_collections
import pytest

from configs import default
from stablemoe_jax.compare import paired, runner, sweep
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.experiment.config_validation import ConfigError
from stablemoe_jax.compare.comparison import Comparison

T_975_2 = 4.302652729749464  # Student t, 2 degrees of freedom, 0.975 quantile (any t table: 4.303)
T_975_1 = 12.706204736174698  # Student t, 1 degree of freedom, 0.975 quantile (any t table: 12.706)


# --- the paired interval and its reading -----------------------------------------------------------------------------

def test_interval_of_three_pairs_is_the_student_t_interval_by_hand():
  result = paired.interval([1.0, 2.0, 4.0])
  mean = 7.0 / 3.0
  sd = math.sqrt(((1 - mean) ** 2 + (2 - mean) ** 2 + (4 - mean) ** 2) / 2)
  half = T_975_2 * sd / math.sqrt(3)
  assert result["n"] == 3 and result["mean"] == pytest.approx(mean)
  assert (result["low"], result["high"]) == pytest.approx((mean - half, mean + half), rel=1e-9)


def test_interval_of_one_or_no_pair_has_no_bounds():
  assert paired.interval([]) == {"n": 0, "mean": None, "low": None, "high": None}
  assert paired.interval([-0.5]) == {"n": 1, "mean": -0.5, "low": None, "high": None}
  assert paired.reading(paired.interval([-0.5])) == "too few paired seeds"


@pytest.mark.parametrize("low, high, words", [
    (-3.0, -0.01, "lower"),  # the whole interval below 0
    (-3.0, 0.0, "not distinguishable"),  # touching 0 from below: 0 is in it
    (-0.5, 2.0, "not distinguishable"),  # across 0, mostly above
    (-2.0, 0.5, "not distinguishable"),  # across 0, mostly below
    (0.0, 3.0, "not distinguishable"),
    (0.01, 3.0, "higher"),
])
def test_reading_tests_the_bound_on_the_side_of_0(low, high, words):
  assert paired.reading({"n": 3, "mean": (low + high) / 2, "low": low, "high": high}) == words


@pytest.mark.parametrize("differences, words", [([-1.0, -1.2, -0.8], "lower"), ([1.0, 1.2, 0.8], "higher"),
                                                ([-1.0, 0.2, -0.4], "not distinguishable"),
                                                ([1.0, -0.2, 0.4], "not distinguishable")])
def test_paired_differences_read_each_method_against_its_baseline(differences, words):
  """Three seeds, non-zero spread: each difference is the method's perplexity minus the baseline's, seed by seed."""
  def record(method, seed, ppl):
    return {"method": method, "seed": seed, "summary": RunSummary(valid={"perplexity": ppl}, test={"perplexity": ppl})}
  base = [150.0, 152.0, 149.0]
  records = [record("dense", s, p) for s, p in enumerate(base)]
  records += [record("moe", s, p + d) for s, (p, d) in enumerate(zip(base, differences))]
  records.append(record("moe", 7, 100.0))  # a seed the baseline lacks is not paired
  entry = paired.paired_differences(records)["moe"]
  assert entry["seeds"] == [0, 1, 2] and entry["test"]["differences"] == pytest.approx(differences)
  assert entry["test"]["high"] > entry["test"]["low"] and entry["test"]["reading"] == words


def test_translation_runs_are_paired_on_valid_nll_and_average_bleu_by_hand():
  def record(method, seed, nll, bleu):
    return {"method": method, "seed": seed, "summary": RunSummary(
        valid={"perplexity": math.exp(nll), "loss": nll}, test={"perplexity": 1.0}, bleu={"average": bleu})}
  records = [record("dense", s, nll, b) for s, (nll, b) in enumerate([(3.0, 20.0), (3.1, 19.0), (2.9, 21.0)])]
  records += [record("stablemoe", s, nll, b) for s, (nll, b) in enumerate([(2.9, 21.0), (2.98, 19.5), (2.82, 23.0)])]
  entry = paired.paired_differences(records)["stablemoe"]
  assert entry["valid_nll"]["differences"] == pytest.approx([-0.1, -0.12, -0.08])
  bleu = [1.0, 0.5, 2.0]
  assert entry["bleu"]["differences"] == pytest.approx(bleu)
  mean = sum(bleu) / 3
  half = T_975_2 * math.sqrt(sum((b - mean) ** 2 for b in bleu) / 2) / math.sqrt(3)
  assert (entry["bleu"]["low"], entry["bleu"]["high"]) == pytest.approx((mean - half, mean + half))
  assert entry["bleu"]["reading"] == "not distinguishable"  # 1.17 +- 1.90 straddles 0
  half = T_975_2 * 0.02 / math.sqrt(3)  # the NLL differences' sd is 0.02: -0.100 +- 0.050 lies below 0
  assert (entry["valid_nll"]["low"], entry["valid_nll"]["high"]) == pytest.approx((-0.1 - half, -0.1 + half))
  assert entry["valid_nll"]["reading"] == "lower"
  table = paired.markdown({"stablemoe": entry}, {})
  assert "valid NLL difference" in table and "| +1.17 [" in table and "| -0.100 [-0.150, -0.050] | lower |" in table
  # A pair with an LM run (no BLEU) is paired on perplexity only.
  records.append({"method": "lm", "seed": 0, "summary": RunSummary(valid={"perplexity": 9.0}, test={"perplexity": 9.0})})
  assert "bleu" not in paired.paired_differences(records)["lm"]


def test_a_method_whose_baseline_has_no_run_is_left_out():
  records = [{"method": "moe", "seed": 0, "summary": RunSummary(valid={"perplexity": 1.0}, test={"perplexity": 1.0})}]
  assert paired.paired_differences(records) == {}
  assert paired.paired_differences(records, pairs={"moe": "base"}) == {}


@pytest.mark.parametrize("text, expected", [("", {}), (" a:b , c:b ", {"a": "b", "c": "b"}), ("a:b,", {"a": "b"})])
def test_parse_pairs_accepts(text, expected):
  assert paired.parse_pairs(text, ["a", "b", "c"]) == expected


@pytest.mark.parametrize("text", ["a", "a:z", "z:a", "a-b"])
def test_parse_pairs_refuses_with_one_line(text):
  with pytest.raises(ConfigError, match="must be METHOD:BASELINE with both in compare.methods"):
    paired.parse_pairs(text, ["a", "b", "c"])


@pytest.mark.parametrize("text, problem", [("a:a", "'a:a' compares a method with itself"),
                                           ("a:b,c:b, a:b", "'a:b' is named twice")])
def test_contrasts_refuse_a_method_against_itself_and_a_repeat(text, problem):
  with pytest.raises(ConfigError, match=f"^compare.contrasts={text!r}: {problem}; name each contrast"):
    paired.parse_contrasts(text, ["a", "b", "c"])


def test_pairs_refuse_an_ablation_with_two_baselines():
  with pytest.raises(ConfigError, match=r"^compare.pairs='a:b,a:c': a named on the left more than once"):
    paired.parse_pairs("a:b,a:c", ["a", "b", "c"])


@pytest.mark.parametrize("text, problem", [("b:b", "'b:b' compares a method with itself"),
                                           ("a:b, a:b", "'a:b' is named twice")])
def test_pairs_refuse_a_method_against_itself_and_a_repeat_naming_their_key(text, problem):
  with pytest.raises(ConfigError, match=f"^compare.pairs={text!r}: {problem}; name each contrast"):
    paired.parse_pairs(text, ["a", "b", "c"])


@pytest.mark.parametrize("text", ["a:b:c", ":b", "a:", "a:B"])
def test_contrasts_refuse_a_malformed_item_naming_it(text):
  with pytest.raises(ConfigError, match=f"^compare.contrasts={text!r}: {text!r} must be METHOD:BASELINE with both "):
    paired.parse_contrasts(text, ["a", "b", "c"])


def test_contrasts_keep_their_order_and_a_method_on_the_left_twice():
  assert paired.parse_contrasts(" a:b, a:c ,c:b,", ["a", "b", "c"]) == [("a", "b"), ("a", "c"), ("c", "b")]
  assert paired.parse_contrasts("a:b,b:a", ["a", "b"]) == [("a", "b"), ("b", "a")]  # reversed: another contrast
  with pytest.raises(ConfigError, match=r"^compare.contrasts='a:z': 'a:z' must be METHOD:BASELINE with both in"):
    paired.parse_contrasts("a:z", ["a", "b", "c"])


def test_a_contrast_is_each_seed_of_one_method_minus_the_other_seed_by_seed():
  """Router against router, by hand: A's NLL minus B's of the same seed, on the seeds both have (B has no seed 3),
  beside a third method that no contrast names; a contrast whose method has no run is left out."""
  def run(method, seed, nll, bleu):
    return {"method": method, "seed": seed, "train_loss": nll + 1.0,
            "summary": RunSummary(valid={"perplexity": math.exp(nll), "loss": nll}, test={"perplexity": 1.0},
                                  bleu={"average": bleu})}
  records = [run("a", 1, 2.0, 20.0), run("a", 2, 2.1, 21.0), run("a", 3, 2.2, 22.0),
             run("b", 1, 2.3, 19.0), run("b", 2, 2.5, 19.5), run("dense", 1, 9.0, 1.0), run("dense", 2, 9.0, 1.0)]
  entries = paired.contrast_differences(records, [("a", "b"), ("b", "a"), ("a", "missing")])
  assert [(method, entry["baseline"], entry["seeds"]) for method, entry in entries] == [("a", "b", [1, 2]),
                                                                                         ("b", "a", [1, 2])]
  assert entries[0][1]["valid_nll"]["differences"] == pytest.approx([-0.3, -0.4])
  assert entries[0][1]["train_loss"]["differences"] == pytest.approx([-0.3, -0.4])
  assert entries[1][1]["bleu"]["differences"] == pytest.approx([-1.0, -1.5])
  mean, half = -0.35, T_975_1 * math.sqrt(0.005) / math.sqrt(2)  # two pairs: sd of (-0.3, -0.4) is sqrt(0.005)
  assert (entries[0][1]["valid_nll"]["low"], entries[0][1]["valid_nll"]["high"]) == pytest.approx((mean - half,
                                                                                                     mean + half))
  table = paired.markdown(entries, {"a": "A", "b": "B"})
  assert table.splitlines()[2].startswith("| A | B | 1, 2 | -0.350 [") and table.splitlines()[3].startswith("| B | A |")


# --- the selection budget and its stage 1 ----------------------------------------------------------------------------

@pytest.mark.parametrize("steps, stage1", [
    (600, 212),  # 300 * 600 / 850 = 211.76: rounded up, where truncation gives 211
    (100, 35),  # 35.29: rounded down, where rounding up gives 36
    (850, 300),  # the full budget: unchanged
])
def test_a_shorter_budget_rounds_stage_1_to_the_nearest_step(steps, stage1):
  config = default.get_config()  # 850 steps, stage 1 300
  assert (config.train.steps, config.train.stage1_steps) == (850, 300)
  run = sweep.setting_config(config, sweep.Setting(6e-3, 40), steps, seed=3)
  assert (run.train.steps, run.train.stage1_steps, run.seed) == (steps, stage1, 3)
  assert run.train.eval_every == min(config.train.eval_every, steps)
  assert run.train.checkpoint_every == min(config.train.checkpoint_every, steps)
  assert (run.train.learning_rate, run.train.warmup_steps) == (6e-3, 40)


def _grid_config(**grid):
  config = default.get_config()
  config.compare = ml_collections.ConfigDict({"methods": "dense,stablemoe", "seeds": 1, "results_dir": "",
                                              "report_only": False, "grid": {"learning_rate": "1e-3",
                                                                             "warmup_steps": "", "steps": 0}})
  config.compare.grid.update(grid)
  return config


@pytest.mark.parametrize("steps, budget", [(0, 850), (850, 850), (1, 1)])
def test_the_selection_budget_at_its_bounds(steps, budget):
  config = _grid_config(steps=steps, warmup_steps="0")
  assert sweep.parse_grid(Comparison.of(config)).steps == budget


@pytest.mark.parametrize("steps", [851, -1])
def test_a_selection_budget_outside_the_run_is_refused(steps):
  with pytest.raises(ConfigError, match=f"compare.grid.steps={steps} must lie in"):
    sweep.parse_grid(Comparison.of(_grid_config(steps=steps, warmup_steps="0")))


@pytest.mark.parametrize("warmup, ok", [("599", True), ("600", False), ("0", True)])
def test_a_grid_warmup_must_end_inside_the_selection_budget(warmup, ok):
  config = _grid_config(steps=600, warmup_steps=warmup)
  if ok:
    assert sweep.parse_grid(Comparison.of(config)).settings[0].warmup_steps == int(warmup)
  else:
    with pytest.raises(ConfigError, match=f"warmup_steps: {warmup} must lie in \\[0, 600\\)"):
      sweep.parse_grid(Comparison.of(config))


def test_one_grid_list_alone_varies_around_the_configs_other_value():
  config = _grid_config(learning_rate="", warmup_steps="10,20")
  assert [(s.learning_rate, s.warmup_steps) for s in sweep.parse_grid(Comparison.of(config)).settings] == [
      (config.train.learning_rate, 10), (config.train.learning_rate, 20)]


def test_per_method_replaces_or_extends_the_shared_grid():
  config = _grid_config(learning_rate="1e-3,2e-3", warmup_steps="10", per_method="dense=4e-3/10;stablemoe=+4e-3/20")
  grid = sweep.parse_grid(Comparison.of(config))
  assert [s.name for s in grid.for_method("dense")] == ["lr0.004_warmup10"] and grid.is_fixed("dense")
  assert [s.name for s in grid.for_method("stablemoe")] == ["lr0.001_warmup10", "lr0.002_warmup10",
                                                            "lr0.004_warmup20"]
  assert not grid.is_fixed("stablemoe")
  with pytest.raises(ConfigError, match="is not in compare.methods"):
    sweep.parse_grid(Comparison.of(_grid_config(per_method="switch=4e-3/10")))


# --- the choice --------------------------------------------------------------------------------------------------------

def _cell(name, valid, alive=True, in_grid=True):
  return {"setting": {"name": name, "learning_rate": 1.0, "warmup_steps": 0}, "valid_ppl": valid, "alive": alive,
          "in_grid": in_grid}


def test_the_choice_is_the_lowest_valid_perplexity_among_live_settings():
  cells = [_cell("a", 150.0, alive=False), _cell("b", 151.0), _cell("c", 152.0), _cell("z", 1.0, in_grid=False)]
  assert sweep.choose(cells)["name"] == "b" and not sweep.choose(cells)["every_setting_dead"]
  assert sweep.choose(cells, rejected=("b",))["name"] == "c"
  marked = sweep.choose(cells, rejected=("b", "c"))
  assert marked["name"] == "a" and marked["every_setting_dead"]  # none left alive: the lowest of all, marked


def test_no_choice_while_a_cell_is_unfinished():
  assert sweep.choose([_cell("a", 150.0), _cell("b", None)]) is None
  assert sweep.choose([]) is None


def test_is_alive_reads_dead_layers():
  assert sweep.is_alive(RunSummary()) and sweep.is_alive(RunSummary(health={"dead_layers": []}))
  assert not sweep.is_alive(RunSummary(health={"dead_layers": ["moe_0"]}))


# --- the runner re-judges a finished run from its own log ------------------------------------------------------------

def _old_summary() -> dict:
  """A summary from before the load rule: no ``top2_load`` in its last window, verdict "alive", worth +5%."""
  return {"steps": 850, "valid": {"perplexity": 150.0}, "test": {"perplexity": 140.0},
          "health": {"ok": True, "dead_layers": [], "last_window_step": 850,
                     "layers": {"moe_0": {"mean_gate": 0.4, "load_balance": 0.3}},
                     "guard": {"min_mean_gate": 0.05, "patience": 2, "after_step": 400},
                     "contribution": {"layers": {"moe_0": {"relative_perplexity_increase": 0.05}}}}}


def _write_run(directory, load) -> None:
  directory.mkdir(parents=True)
  (directory / "summary.json").write_text(json.dumps(_old_summary()))
  window = {"step": 850, "loss": 5.0, "moe/moe_0/load": load, "moe/moe_0/mean_gate": 0.4}
  (directory / "metrics.jsonl").write_text(json.dumps({**window, "step": 800, "moe/moe_0/load": [0.125] * 8}) + "\n"
                                           + json.dumps(window) + "\n"
                                           + json.dumps({"step": 850, "valid/perplexity": 150.0}) + "\n")


@pytest.mark.parametrize("where", ["workdir", "results_dir"])
def test_an_old_summary_whose_last_window_is_degenerate_is_found_dead_by_the_runner(tmp_path, where):
  """94% of the tokens on two of 8 experts in the last logged window: the runner's summary is dead, whether the run
  is read from the workdir or from the committed results folder."""
  root = tmp_path / ("work" if where == "workdir" else "results")
  _write_run(root / "moe" / "seed0", [0.93, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01])
  exported = root if where == "results_dir" else None
  summary, source, _ = runner.train_run(None, tmp_path / "work", "moe/seed0", print, "[1/1]", exported, train=False)
  assert source == root / "moe" / "seed0"
  assert summary.health["dead_layers"] == ["moe_0"] and not summary.health["ok"]
  assert summary.health["verdict"]["moe_0"]["top2_load"] == pytest.approx(0.94)
  assert not sweep.is_alive(summary)
  assert summary.health["layers"] == _old_summary()["health"]["layers"]  # the raw measures are kept


def test_an_old_summary_whose_last_window_is_balanced_stays_alive(tmp_path):
  _write_run(tmp_path / "moe" / "seed0", [0.2, 0.2] + [0.1] * 6)  # 40% on the two busiest
  summary, _, _ = runner.train_run(None, tmp_path, "moe/seed0", print, "[1/1]", None, train=False)
  assert summary.health["dead_layers"] == [] and summary.health["verdict"]["moe_0"]["top2_load"] == 0.4


def test_the_runner_leaves_a_summary_without_health_as_it_is(tmp_path):
  summary = RunSummary(valid={"perplexity": 1.0})
  assert runner.judged(summary, tmp_path) is summary


@pytest.mark.parametrize("text, values", [("2.0, 40", [2, 40]), ("1e2", [100]), (" , 3,", [3])])
def test_grid_warmups_accept_whole_numbers_in_any_spelling(text, values):
  assert sweep._values(text, int, "warmup_steps") == values  # pylint: disable=protected-access


# --- where the runner finds a finished run ---------------------------------------------------------------------------

def test_a_finished_run_is_read_from_its_workdir_before_the_results_copy_and_exported_once(tmp_path):
  workdir, results = tmp_path / "work", tmp_path / "results"
  _write_run(workdir / "moe" / "seed0", [0.125] * 8)
  assert runner.find_finished(workdir / "moe" / "seed0", results / "moe" / "seed0") == workdir / "moe" / "seed0"
  assert runner.find_finished(tmp_path / "none", None) is None
  _, source, status = runner.train_run(None, workdir, "moe/seed0", print, "[1/1]", results, train=False)
  assert source == workdir / "moe" / "seed0" and status == "finished earlier"
  exported = results / "moe" / "seed0"
  assert sorted(p.name for p in exported.iterdir()) == ["metrics.jsonl", "summary.json"]  # no routing records
  assert (exported / "summary.json").read_bytes() == (workdir / "moe" / "seed0" / "summary.json").read_bytes()
  assert runner.find_finished(tmp_path / "elsewhere", exported) == exported


def test_an_unfinished_run_in_report_only_is_not_trained(tmp_path):
  assert runner.train_run(None, tmp_path, "moe/seed0", print, "[1/1]", None, train=False) is None


@pytest.mark.parametrize("steps, suffix", [(850, "seed0"), (600, "steps600_seed0")])
def test_a_grid_run_under_a_shorter_budget_has_a_folder_of_its_own(steps, suffix):
  grid = sweep.Grid((sweep.Setting(4e-3, 400),), steps)
  assert sweep.grid_relative("base", grid.settings[0], grid, 850) == f"base/lr0.004_warmup400/{suffix}"

"""The comparison command: methods validated before training, resumable runs, the table, the JSON and the plot."""
from __future__ import annotations

import json
import subprocess
import sys

import ml_collections
import pytest
from tests.conftest import REPO, share_prepared_ptb

from stablemoe_jax.compare import figures, report, runner
from stablemoe_jax.compare import methods as methods_lib
from stablemoe_jax.experiment import loop
from stablemoe_jax.core.summary import RunSummary
from stablemoe_jax.experiment.config_validation import ConfigError
from stablemoe_jax.compare.comparison import Comparison


def _compare_config(tiny_config, method_names: str, seeds: int = 1):
  config = ml_collections.ConfigDict(tiny_config.to_dict())
  config.compare = ml_collections.ConfigDict({"methods": method_names, "seeds": seeds})
  return config


def test_every_method_is_checked_before_any_training(tiny_config, tmp_path, monkeypatch):
  monkeypatch.setitem(methods_lib.METHODS, "future", methods_lib.Method(
      "future", "a router not built yet", {"model.moe.future_router.width": 3}))
  monkeypatch.setitem(methods_lib.METHODS, "bad_value", methods_lib.Method(
      "bad_value", "zero experts", {"model.moe.num_experts": 0}))
  monkeypatch.setitem(methods_lib.METHODS, "more_steps", methods_lib.Method(
      "more_steps", "a bigger budget", {"train.steps": 99}))
  cases = {"stablemoe,future": "method 'future' sets model.moe.future_router.width=3, but the config has no "
                               "section model.moe.future_router",
           "stablemoe,bad_value": "method 'bad_value' .*model.moe.num_experts=0 must be positive",
           "more_steps": "method 'more_steps' overrides train.steps; methods may only change model.",
           "stablemoe,nosuch": "unknown method 'nosuch'",
           "dense,dense": "names a method twice"}
  for names, message in cases.items():
    with pytest.raises(ConfigError, match=message):
      runner.run_all(Comparison.of(_compare_config(tiny_config, names)), tmp_path)
  assert not any(tmp_path.iterdir())  # nothing was built, not even the first (valid) method's run


def test_docs_table_of_methods_names_every_method_in_order():
  rows = [line for line in (REPO / "docs/comparison.md").read_text().splitlines() if line.startswith("| `")]
  assert [row.split("`")[1] for row in rows] == list(methods_lib.METHODS)


def test_unknown_method_on_the_command_line_is_one_clear_error(tmp_path):
  result = subprocess.run([sys.executable, "-m", "stablemoe_jax.compare", "--config", "configs/compare_cpu.py",
                           "--workdir", str(tmp_path), "--config.compare.methods=stablemoe,nosuch"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  assert "error: compare.methods: unknown method 'nosuch'" in result.stderr and "Traceback" not in result.stderr


def test_no_convergence_plot_when_the_runs_trained_on_different_devices(tmp_path):
  rows = [{"label": "dense", "devices": ["1 x cpu"], "curve": [[10.0, 300.0], [20.0, 200.0]]},
          {"label": "Switch", "devices": ["1 x NVIDIA H100 80GB HBM3", "1 x cpu"], "curve": [[5.0, 250.0]]}]
  (tmp_path / "convergence.png").write_bytes(b"stale")
  assert "more than one kind of device" in figures.write_convergence_plot(rows, tmp_path / "convergence.png")
  assert not (tmp_path / "convergence.png").exists()
  rows[1]["devices"] = ["1 x cpu"]
  assert "(convergence.png)" in figures.write_convergence_plot(rows, tmp_path / "convergence.png")
  assert (tmp_path / "convergence.png").read_bytes()[:4] == b"\x89PNG"


def test_curves_leave_off_a_final_validation_that_scores_other_batches(tmp_path):
  records = [{"step": 4, "valid/perplexity": 30.0, "train_seconds": 10.0, "trained_tokens": 400.0},
             {"step": 8, "valid/perplexity": 20.0, "train_seconds": 20.0, "trained_tokens": 800.0},
             {"step": 10, "trained_tokens": 1000.0}]
  summary = RunSummary(steps=10, train_seconds=25.0, valid={"perplexity": 24.0})
  alike = runner.validation_curves(records, summary, tokens_per_step=100, final_measured_alike=True)
  assert alike == {"curve": [[10.0, 30.0], [20.0, 20.0], [25.0, 24.0]],
                   "token_curve": [[400.0, 30.0], [800.0, 20.0], [1000.0, 24.0]]}
  # The final scores the whole split, the in-training points a prefix: the final point is not on their curve.
  prefix = runner.validation_curves(records, summary, tokens_per_step=100, final_measured_alike=False)
  assert prefix == {"curve": [[10.0, 30.0], [20.0, 20.0]], "token_curve": [[400.0, 30.0], [800.0, 20.0]]}
  # A run that validated only at the end keeps that one point.
  assert runner.validation_curves(records[2:], summary, 100, final_measured_alike=False)["token_curve"] == [[1000.0, 24.0]]

  # Which batches a run's points score: train.eval_batches against the split's batches, where the run tells them.
  config = ml_collections.ConfigDict({"train": {"eval_batches": 10}, "eval": {"max_batches": 0, "batch_size": 32}})
  recorded = RunSummary(valid={"tokens": 58322, "batches": 18}, eval={"mode": "teacher_forced_sentences"})
  assert runner.validation_scope(config, recorded) == (10, False)
  config.train.eval_batches = 18  # every batch of the split: the whole split, as the final scores it
  assert runner.validation_scope(config, recorded) == (0, True)
  # An LM run from before the batches were recorded: 73,759 predictions in blocks of 128 are 577 rows, 19 batches
  # of 32 rows; 20 in-training batches are all of them.
  old_lm = RunSummary(valid={"tokens": 73759}, eval={"mode": "blocks", "seq_len": 128, "stride": 128})
  assert runner.split_batches(config, old_lm) == 19
  for eval_batches, scope in ((20, 0), (19, 0), (18, 18), (0, 0)):
    config.train.eval_batches = eval_batches
    assert runner.validation_scope(config, old_lm) == (scope, scope == 0)
  # A run whose split size is not told (an old translation run) is judged by the numbers asked for.
  untold = RunSummary(valid={"tokens": 58322}, eval={"mode": "teacher_forced_sentences"})
  config.train.eval_batches = 20
  assert runner.split_batches(config, untold) is None and runner.validation_scope(config, untold) == (20, False)
  # A final validation of a prefix: alike only with the same prefix in training.
  config.eval.max_batches = 20
  assert runner.validation_scope(config, untold) == (20, True)
  # A final prefix that scored fewer batches than asked tells the split's size; as many as asked does not.
  assert runner.split_batches(config, recorded) == 18
  config.eval.max_batches = 18
  assert runner.split_batches(config, recorded) is None
  rows = [{"label": "dense", "curve_batches": 10, "token_curve": prefix["token_curve"]}]
  line = figures.write_token_plot(rows, tmp_path / "tokens.png")
  assert (tmp_path / "tokens.png").exists() and "first 10 batches" in line and "not a point of the curves" in line
  assert figures.validation_label([{"curve_batches": 0}]) == "validation perplexity (mean over seeds)"


def test_fluctuation_curve_is_the_mean_of_the_runs_that_kept_one():
  """Runs exported before curves were kept (shares only) are left out of the mean, and the plot's label says so."""
  def run(first, middle):
    return {"after_20": 1 - first, "after_50": 1 - middle, "curve": {"percent": [0, 50, 100],
                                                                      "share": [first, middle, 1.0]}}
  shares_only = {"after_20": 0.5, "after_50": 0.0, "after_80": 0.0}
  curve = report._mean_fluctuation_curve([shares_only, run(0.2, 0.6), run(0.4, 1.0)])
  assert curve["percent"] == [0, 50, 100] and curve["runs"] == 2
  assert curve["share"] == pytest.approx([0.3, 0.8, 1.0])
  assert figures._curve_label({"label": "Switch", "seeds": [0, 1, 2], "fluctuation_curve": curve}) == (
      "Switch (2 of 3 seeds)")
  whole = report._mean_fluctuation_curve([run(0.2, 0.6)])
  assert figures._curve_label({"label": "Switch", "seeds": [0], "fluctuation_curve": whole}) == "Switch"
  assert report._mean_fluctuation_curve([shares_only, None]) is None
  other_records = {**run(0.1, 0.1), "curve": {"percent": [0, 100], "share": [0.1, 1.0]}}
  assert report._mean_fluctuation_curve([run(0.2, 0.6), other_records]) is None


def test_k_set_column_shows_the_mean_k_set_shares_only_for_top_k_rows():
  """The k-set cell is the seeds' mean of each run's k-set shares; a file from before top-k routing counts its
  first-choice shares as its k-set's; a table of top-1 rows leaves the column out (it would repeat the first-choice
  column)."""
  two = {"after_20": 0.5, "after_50": 0.25, "after_80": 0.0, "top_k": 2,
         "k_set": {"after_20": 0.75, "after_50": 0.5, "after_80": 0.25}}
  other = {**two, "k_set": {"after_20": 0.25, "after_50": 0.0, "after_80": 0.25}}
  old = {"after_20": 0.5, "after_50": 0.0, "after_80": 0.0}
  assert report._k_set_shares([two, other]) == {"after_20": 0.5, "after_50": 0.25, "after_80": 0.25}
  assert report._k_set_shares([old]) == old and report._k_set_shares([two, None]) is None
  assert report._top_k([two, old]) == 2 and report._top_k([old]) == 1 and report._top_k([None]) == 1
  columns = [("method", lambda r: r["label"]), report.K_SET_COLUMN]
  rows = [{"label": "Switch top-2", "top_k": 2, "fluctuation_k_set": report._k_set_shares([two, other])},
          {"label": "Dense", "top_k": 1, "fluctuation_k_set": None}]
  table = report.markdown_table(rows, columns)
  assert "| Switch top-2 | 50.0% / 25.0% / 25.0% |" in table and "| Dense | -- |" in table
  assert report.K_SET_COLUMN[0] not in report.markdown_table([{**rows[1], "top_k": 1}], columns)


@pytest.mark.slow
def test_comparison_trains_each_method_once_resumes_and_reports(tiny_config, prepared_ptb, tmp_path):
  config = _compare_config(tiny_config, "stablemoe,dense", seeds=2)
  config.train.eval_batches = config.eval.max_batches  # in-training and final validation alike: one curve
  # The runner shares workdir/data between its runs: here the session's prepared corpus, for the killed run too.
  share_prepared_ptb(prepared_ptb, tmp_path, runner.run_dir(tmp_path, "dense", 1))
  config.analysis.record_every = 3  # routing records at steps 0, 3, ..., 12: the fluctuation column
  config.analysis.report_at_end = True
  dense_config = methods_lib.apply_overrides(config, methods_lib.METHODS["dense"])
  dense_config.seed = config.seed + 1
  # A killed run: dense, seed index 1, stopped after step 6 (its last checkpoint is step 4).
  assert loop.train_and_evaluate(dense_config, runner.run_dir(tmp_path, "dense", 1), stop_at_step=6)

  lines = []
  records = runner.run_all(Comparison.of(config), tmp_path, log=lambda line, **_: lines.append(line))
  rows = report.write_reports(Comparison.of(config), records, tmp_path)
  assert [(r["method"], r["seed"]) for r in records] == [("stablemoe", 0), ("stablemoe", 1), ("dense", 0), ("dense", 1)]
  assert sum("training in" in line for line in lines) == 4 and len(lines) == 8
  killed = records[3]
  assert killed["summary"].train_seconds >= killed["curve"][0][0] > 0

  # Every number in the table and the JSON comes from the runs' summaries.
  stable, dense = rows
  for row, runs in ((stable, records[:2]), (dense, records[2:])):
    ppl = [r["summary"].valid["perplexity"] for r in runs]
    assert row["valid_ppl"] == ppl and row["valid_ppl_mean"] == pytest.approx(sum(ppl) / 2)
    assert row["valid_ppl_std"] == pytest.approx(abs(ppl[0] - ppl[1]) / 2 ** 0.5)
    # Curves: the in-training validation at step 6, then the final one (both the split's first 4 batches, as the
    # summary records them), at growing training time.
    assert all(r["summary"].valid["batches"] == 4 and r["curve_batches"] == 4 for r in runs)
    assert len(row["curve"]) == 2 and row["curve"][0][0] < row["curve"][1][0]
  assert dense["expert_params"] == 0 and stable["expert_params"] > 0
  assert stable["shared_params"] > dense["shared_params"]  # the routers
  assert stable["flops_per_token"] > dense["flops_per_token"]
  assert 0 <= stable["distill_agreement_at_boundary"] <= 1 and dense["distill_agreement_at_boundary"] is None
  # StableMoE trains with the frozen distilled routing from step 5 of 12: no token changes expert after 50%.
  assert stable["fluctuation"]["after_50"] == 0.0 == stable["fluctuation"]["after_80"]
  assert 0 <= stable["fluctuation"]["after_20"] <= 1 and dense["fluctuation"] is None
  # The curve (records at steps 0, 3, ..., 12): every token settled by the last stage-1 record (step 3; the frozen
  # routing from step 5 on); the shares are its complements at 20/50/80% of training.
  curve = stable["fluctuation_curve"]
  assert curve["percent"] == pytest.approx([0, 25, 50, 75, 100]) and dense["fluctuation_curve"] is None
  assert curve["share"][1:] == [1.0] * 4 and 1 - curve["share"][0] == pytest.approx(stable["fluctuation"]["after_20"])
  saved = json.loads((tmp_path / "comparison.json").read_text())
  assert [m["valid_ppl_mean"] for m in saved["methods"]] == [stable["valid_ppl_mean"], dense["valid_ppl_mean"]]
  table = (tmp_path / "comparison.md").read_text()
  assert f"| StableMoE | {stable['shared_params'] / 1e6:.2f}M | {stable['expert_params'] / 1e6:.2f}M |" in table
  assert f"{dense['valid_ppl_mean']:.2f} ± {dense['valid_ppl_std']:.2f}" in table
  # StableMoE's fluctuation cell (stage-1 churn after 20%, none after 50% / 80%); dense has "--"
  assert table.count(f"| {stable['fluctuation']['after_20']:.1%} / 0.0% / 0.0% |") == 1
  assert (tmp_path / "convergence.png").read_bytes()[:4] == b"\x89PNG"
  assert (tmp_path / "fluctuation.png").read_bytes()[:4] == b"\x89PNG" and "(fluctuation.png)" in table

  # Run again: nothing is retrained and the results are the same.
  lines.clear()
  again = runner.run_all(Comparison.of(config), tmp_path, log=lambda line, **_: lines.append(line))
  assert all("finished earlier" in line for line in lines) and len(lines) == 4
  assert [r["summary"] for r in again] == [r["summary"] for r in records]

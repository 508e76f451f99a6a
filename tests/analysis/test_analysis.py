"""Routing analysis: fluctuation math, cohesion counts, records across kill and resume, analyze mode, plot CLI."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from tests.conftest import REPO, share_prepared_ptb

from stablemoe_jax.analysis import cohesion, fluctuation, records
from stablemoe_jax.commands.analyze import analyze_checkpoint
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config

# Hand-made assignments: 5 record steps (rows) x 4 tokens (columns).
STEPS = np.array([0, 10, 20, 30, 40])
ASSIGNMENTS = np.array([
    [1, 0, 2, 1],
    [1, 1, 2, 2],
    [1, 1, 0, 3],
    [1, 1, 2, 0],
    [1, 1, 2, 3],
])
# token 0 never differs from its final expert; token 1 last differs at step 0; token 2 at 20; token 3 at 30.


def test_last_fluctuation_step_of_hand_made_assignments():
  np.testing.assert_array_equal(fluctuation.last_fluctuation_steps(STEPS, ASSIGNMENTS), [-1, 0, 20, 30])
  # With layers: [K, L, T]; layer 1 is layer 0 with token 0 moving at step 10.
  layered = np.stack([ASSIGNMENTS, ASSIGNMENTS], axis=1)
  layered[1, 1, 0] = 3
  np.testing.assert_array_equal(fluctuation.last_fluctuation_steps(STEPS, layered), [[-1, 0, 20, 30], [10, 0, 20, 30]])


def test_cumulative_shares_of_hand_made_assignments():
  last = fluctuation.last_fluctuation_steps(STEPS, ASSIGNMENTS)
  x, share = fluctuation.cumulative_curve(last, STEPS)
  np.testing.assert_allclose(x, [0, 25, 50, 75, 100])
  np.testing.assert_allclose(share, [2 / 4, 2 / 4, 3 / 4, 4 / 4, 4 / 4])
  # After 20% (step 8): tokens 2 and 3; after 50% (step 20, strictly after): token 3; after 80% (32): none.
  assert fluctuation.shares_after(last, final_step=40) == {"after_20": 0.5, "after_50": 0.25, "after_80": 0.0}


def _records(steps, train, stage1_steps, total_steps=None):
  train = np.asarray(train)[:, None, :]  # one layer
  meta = {"layers": ["moe_0"], "stage1_steps": stage1_steps, "steps": total_steps or int(steps[-1])}
  return records.Records(np.asarray(steps), train, train.copy(), np.arange(train.shape[-1]), meta)


def test_summary_says_whether_stage2_routing_fluctuates():
  frozen = np.array([[0, 1, 2], [1, 1, 0], [2, 1, 0], [2, 1, 0], [2, 1, 0]])  # identical from step 20 on
  summary = fluctuation.summarize(_records(STEPS, frozen, stage1_steps=20), "train")["all_layers"]
  assert summary["stage2_records_identical"] and summary["fluctuating_in_stage2"] == 0.0
  assert summary["last_fluctuation_step_max"] == 10 and summary["never_fluctuating"] == pytest.approx(1 / 3)
  summary = fluctuation.summarize(_records(STEPS, ASSIGNMENTS, stage1_steps=20), "train")["all_layers"]
  assert not summary["stage2_records_identical"] and summary["fluctuating_in_stage2"] == 0.5
  # The record at the boundary step itself is stage 2's first (routed by the frozen table): a change between it and
  # the next record is a stage-2 fluctuation, though the records after it agree.
  moved_after_boundary = np.array([[0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 2, 2], [0, 2, 2]])
  summary = fluctuation.summarize(_records(STEPS, moved_after_boundary, stage1_steps=20), "train")["all_layers"]
  assert not summary["stage2_records_identical"] and summary["fluctuating_in_stage2"] == pytest.approx(1 / 3)
  assert summary["last_fluctuation_step_max"] == 20 and summary["never_fluctuating"] == pytest.approx(2 / 3)
  # A run whose stage 1 covers all of training has no stage-2 records to compare.
  summary = fluctuation.summarize(_records(STEPS, ASSIGNMENTS, stage1_steps=40))["all_layers"]
  assert summary["stage2_records_identical"] is None



# Hand-made top-2 choices: the same 5 record steps x 3 tokens x 2 choices (first choice first).
CHOICES = np.array([
    [[1, 2], [0, 3], [2, 0]],
    [[2, 1], [0, 3], [3, 1]],
    [[1, 2], [0, 1], [2, 0]],
    [[1, 2], [0, 3], [2, 0]],
    [[2, 1], [0, 3], [2, 0]],
])
# token 0: the set {1, 2} throughout, its first choice swapping (last differing from the final 2 at step 30);
# token 1: first choice 0 throughout, its set {0, 1} once at step 20; token 2: both change at step 10 only.


def _topk_records(choices, stage1_steps=20):
  choices = np.asarray(choices)[:, None]  # [K, 1 layer, T, k]
  meta = {"layers": ["moe_0"], "stage1_steps": stage1_steps, "steps": int(STEPS[-1])}
  return records.Records(STEPS, choices[..., 0], choices[..., 0].copy(), np.arange(choices.shape[2]), meta,
                         train_choices=choices, inference_choices=choices.copy())


def test_kset_fluctuation_of_hand_made_top2_choices():
  sets = fluctuation.kset_assignments(CHOICES)
  assert (sets[:, 0] == sets[0, 0]).all()  # {1, 2} in either order is one set
  assert sets[2, 1] != sets[0, 1] and (sets[[0, 1, 3, 4], 1] == sets[0, 1]).all()
  np.testing.assert_array_equal(fluctuation.last_fluctuation_steps(STEPS, CHOICES[..., 0]), [30, -1, 10])
  np.testing.assert_array_equal(fluctuation.last_fluctuation_steps(STEPS, sets), [-1, 20, 10])
  summary = fluctuation.summarize(_topk_records(CHOICES), "train")
  assert summary["top_k"] == 2
  top1, kset = summary["all_layers"], summary["k_set"]["all_layers"]
  # Final step 40: after 20% = after step 8, 50% = 20 (strictly after), 80% = 32.
  assert (top1["after_20"], top1["after_50"], top1["after_80"]) == (2 / 3, 1 / 3, 0.0)
  assert (kset["after_20"], kset["after_50"], kset["after_80"]) == (2 / 3, 0.0, 0.0)
  assert top1["never_fluctuating"] == pytest.approx(1 / 3) and kset["never_fluctuating"] == pytest.approx(1 / 3)
  assert top1["fluctuating_in_stage2"] == pytest.approx(1 / 3) and kset["fluctuating_in_stage2"] == pytest.approx(1 / 3)
  assert summary["k_set"]["layers"]["moe_0"] == kset
  exported = fluctuation.shares_and_curve(_topk_records(CHOICES))
  assert exported["top_k"] == 2 and exported["after_50"] == 1 / 3 and exported["k_set"]["after_50"] == 0.0
  np.testing.assert_allclose(exported["k_set"]["curve"]["share"], [1 / 3, 2 / 3, 3 / 3, 3 / 3, 3 / 3])
  np.testing.assert_allclose(exported["curve"]["share"], [1 / 3, 2 / 3, 2 / 3, 3 / 3, 3 / 3])


def test_top1_records_give_equal_kset_numbers_and_old_files_still_read(tmp_path):
  """A top-1 run's record file is what it was before top-k (only ``train`` and ``inference``, [L, T]); an old file
  reads as k = 1; its k-set numbers equal its first choice's, today's numbers, exactly."""
  directory = tmp_path / "routing"
  layered = np.stack([ASSIGNMENTS, (ASSIGNMENTS + 1) % 4], axis=1)  # [K, 2 layers, T]
  records.write_meta(directory, {"layers": ["moe_0", "moe_1"], "num_experts": 4, "steps": 40, "stage1_steps": 20},
                     np.zeros((2, 4), np.int32), np.ones((2, 4), bool))
  for step, routed in zip(STEPS, layered):
    records.write_record(directory, int(step), routed[..., None], routed[..., None], num_experts=4)
    old = tmp_path / "old.npz"
    np.savez(old, train=routed.astype(np.int8), inference=routed.astype(np.int8))  # what the code of d1da3c4 wrote
    assert (directory / f"step_{step:08d}.npz").read_bytes() == old.read_bytes()
  loaded = records.load_records(tmp_path)
  assert loaded.top_k == 1 and loaded.train_choices.shape == (5, 2, 4, 1)
  np.testing.assert_array_equal(loaded.choices("inference")[..., 0], layered)
  summary = fluctuation.summarize(loaded)
  assert summary["all_layers"]["after_20"] == 0.5 and summary["top_k"] == 1
  assert summary["k_set"] == {"all_layers": summary["all_layers"], "layers": summary["layers"]}
  exported = fluctuation.shares_and_curve(loaded)
  assert exported["k_set"] == {key: exported[key] for key in ("after_20", "after_50", "after_80", "curve")}


def test_topk_records_round_trip(tmp_path):
  directory = tmp_path / "routing"
  records.write_meta(directory, {"layers": ["moe_0"], "num_experts": 4, "steps": 40, "stage1_steps": 20},
                     np.zeros((1, 3), np.int32), np.ones((1, 3), bool))
  for step, routed in zip(STEPS, CHOICES):
    records.write_record(directory, int(step), routed[None], routed[None, :, ::-1], num_experts=4)
  saved = dict(np.load(directory / "step_00000010.npz"))
  assert sorted(saved) == ["inference", "inference_choices", "train", "train_choices"]
  np.testing.assert_array_equal(saved["train"], CHOICES[1][None, :, 0])  # the first choice, as top-1 readers expect
  loaded = records.load_records(tmp_path)
  assert loaded.top_k == 2
  np.testing.assert_array_equal(loaded.choices("train")[:, 0], CHOICES)
  np.testing.assert_array_equal(loaded.assignments("inference")[:, 0], CHOICES[..., 1])
  summary = fluctuation.summarize(loaded)
  assert summary["k_set"]["all_layers"]["after_50"] == 0.0 and summary["all_layers"]["after_50"] == 1 / 3
  # The inference records hold the reversed choices: the same sets, the second choices first.
  assert fluctuation.summarize(loaded, "inference")["k_set"] == summary["k_set"]


def test_cohesion_counts_every_choice_and_gates_by_the_largest():
  # The second token's first choice carries the smaller gate (DeepSeek ranks on affinity + bias); the third token's
  # gates are both under LOW_GATE; the last one is padding.
  counts = cohesion.RoutingCounts(num_experts=3, vocab_size=10)
  counts.add(token_ids=[5, 3, 9, 7], expert_index=[[0, 1], [1, 2], [2, 0], [0, 2]],
             gate=[[0.6, 0.4], [0.005, 0.995], [0.008, 0.002], [0.7, 0.3]], mask=[1, 1, 1, 0])
  stats = counts.load_stats()
  assert stats["tokens"] == 3 and stats["load"] == pytest.approx([2 / 6, 2 / 6, 2 / 6])
  assert stats["mean_gate"] == pytest.approx((0.6 + 0.995 + 0.008) / 3) and stats["low_gate_fraction"] == 1 / 3
  assert stats["mean_gate_per_expert"] == pytest.approx([(0.6 + 0.002) / 2, (0.4 + 0.005) / 2, (0.995 + 0.008) / 2])
  table = counts.top_tokens(2, id_to_token=str)
  assert [[t["id"] for t in row["top"]] for row in table] == [[5, 9], [3, 5], [3, 9]]

def test_cohesion_counts_of_a_hand_routed_example():
  counts = cohesion.RoutingCounts(num_experts=3, vocab_size=10)
  counts.add(token_ids=[5, 5, 3, 7, 3, 5, 9], expert_index=[0, 0, 1, 0, 1, 1, 2],
             gate=[0.5, 0.7, 0.2, 0.3, 0.4, 0.6, 0.9], mask=[1, 1, 1, 1, 1, 1, 0])  # the last one is padding
  counts.add(token_ids=[7], expert_index=[0], gate=[0.5])
  table = counts.top_tokens(2, id_to_token=lambda i: f"w{i}")
  assert [row["tokens"] for row in table] == [4, 3, 0]
  assert [row["load"] for row in table] == [4 / 7, 3 / 7, 0.0]
  assert table[0]["top"] == [{"token": "w5", "id": 5, "count": 2, "share": 0.5},
                             {"token": "w7", "id": 7, "count": 2, "share": 0.5}]
  assert table[1]["top"] == [{"token": "w3", "id": 3, "count": 2, "share": 2 / 3},
                             {"token": "w5", "id": 5, "count": 1, "share": 1 / 3}]
  assert table[2]["top"] == []
  stats = counts.load_stats()
  assert stats["tokens"] == 7 and stats["load"] == pytest.approx([4 / 7, 3 / 7, 0.0])
  assert stats["load_entropy"] == pytest.approx(-(4 / 7) * np.log(4 / 7) - (3 / 7) * np.log(3 / 7))
  assert stats["mean_gate"] == pytest.approx((0.5 + 0.7 + 0.2 + 0.3 + 0.4 + 0.6 + 0.5) / 7)
  assert stats["mean_gate_per_expert"] == pytest.approx([2.0 / 4, 1.2 / 3, 0.0])
  markdown = cohesion.markdown_table({"moe_0": table})
  assert "| 0 | 57.1% | `w5` (2, 50.0%), `w7` (2, 50.0%) |" in markdown


def test_analysis_settings_are_validated(tiny_config):
  tiny_config.analysis.sample_tokens = 8
  with pytest.raises(ConfigError, match="analysis.sample_tokens=8 must be at least train.seq_len=16"):
    validate_config(tiny_config)
  tiny_config.analysis.sample_tokens, tiny_config.analysis.record_every = 4096, -1
  with pytest.raises(ConfigError, match="analysis.record_every=-1 must be >= 0"):
    validate_config(tiny_config)


def _analysis_config(ptb_dir):
  from tests.conftest import make_tiny_config
  config = make_tiny_config(ptb_dir)  # 12 steps, checkpoints every 4 steps
  # Stage 1 = updates 1-6, so the boundary step 6 is recorded: its record must already use the stage-2 routing.
  config.train.stage1_steps = 6
  config.analysis.record_every, config.analysis.sample_tokens = 2, 1024
  config.analysis.report_at_end = True
  return config


@pytest.fixture(scope="module")
def recorded_run(ptb_dir, prepared_ptb, tmp_path_factory):
  config = _analysis_config(ptb_dir)
  workdir = tmp_path_factory.mktemp("recorded")
  share_prepared_ptb(prepared_ptb, workdir)
  summary = loop.train_and_evaluate(config, workdir)
  return config, workdir, summary


def _all_records(workdir):
  directory = records.records_dir(workdir)
  return {s: dict(np.load(directory / f"step_{s:08d}.npz")) for s in records.record_steps(directory)}


def test_records_are_written_at_the_record_steps_compactly(recorded_run):
  _, workdir, _ = recorded_run
  loaded = records.load_records(workdir)
  assert loaded.steps.tolist() == [0, 2, 4, 6, 8, 10, 12]
  assert loaded.train.dtype == np.int8 and loaded.train.shape == (7, 1, 1024)
  assert loaded.sample_tokens.shape == (1024,) and loaded.meta["layers"] == ["moe_0"]
  assert loaded.train.min() >= 0 and loaded.train.max() < 4
  # The sample is the first 1024 tokens of the validation split.
  from stablemoe_jax.data.lm import pipeline as data_lib
  valid = data_lib.load_lm_data(from_config(recorded_run[0]).data, workdir / "data").stream("valid")
  np.testing.assert_array_equal(loaded.sample_tokens, valid.read(0, 1024))


def test_stablemoe_training_routing_does_not_fluctuate_in_stage2(recorded_run):
  config, workdir, summary = recorded_run
  loaded = records.load_records(workdir)
  stage2 = loaded.train[loaded.steps >= config.train.stage1_steps]  # records 6, 8, 10, 12
  assert len(stage2) == 4 and all((r == stage2[0]).all() for r in stage2)
  assert not (loaded.train[0] == loaded.train[2]).all()  # stage 1 (greedy) routing moves
  # Stage 2 routes by the frozen table: the argmax of the distilled router's logits for each token id.
  _, state, _ = _restore(config, workdir)
  distilled = jax.device_get(state.params["moe_0"]["router"]["distilled_router"])
  table = np.argmax(distilled["embedding"] @ distilled["centroids"].T, axis=-1)
  np.testing.assert_array_equal(stage2[-1, 0], table[loaded.sample_tokens])
  np.testing.assert_array_equal(loaded.inference[-1, 0], table[loaded.sample_tokens])
  train_summary = json.loads((workdir / "analysis" / "fluctuation.json").read_text())["train"]
  assert train_summary["all_layers"]["stage2_records_identical"]
  assert train_summary["all_layers"]["fluctuating_in_stage2"] == 0.0
  assert train_summary["all_layers"]["last_fluctuation_step_max"] < config.train.stage1_steps
  assert summary.analysis["fluctuation"]["train"]["after_50"] == 0.0  # stage 1 is 6/12 = 50% of training
  assert fluctuation.shares_from_workdir(workdir) == {
      k: train_summary["all_layers"][k] for k in ("after_20", "after_50", "after_80")}


def _restore(config, workdir):
  exp = loop.Experiment(config, workdir)
  try:
    step = exp.checkpointer.latest_step
    state, data = exp.checkpointer.restore(step, exp.abstract_state(), for_training=False)
  finally:
    exp.checkpointer.close()
  return step, state, data


@pytest.mark.slow  # two short training runs: about 30 s on an idle 2-core machine
def test_records_survive_stop_and_resume_exactly(recorded_run, tmp_path):
  config, full_dir, _ = recorded_run
  shutil.copytree(full_dir / "data", tmp_path / "data")  # the prepared corpus, to save its preparation
  config = config.copy_and_resolve_references()
  config.analysis.report_at_end = False
  assert loop.train_and_evaluate(config, tmp_path, stop_at_step=7) == {"stopped_at_step": 7}
  assert records.record_steps(records.records_dir(tmp_path)) == [0, 2, 4, 6]  # 6 lies past the checkpoint (4)
  # Spoil the record the resumed run must drop and rewrite: the result must still be exact.
  spoiled = records.records_dir(tmp_path) / "step_00000006.npz"
  np.savez(spoiled, train=np.zeros((1, 1024), np.int8), inference=np.zeros((1, 1024), np.int8))
  loop.train_and_evaluate(config, tmp_path)
  full, resumed = _all_records(full_dir), _all_records(tmp_path)
  assert sorted(resumed) == sorted(full) == [0, 2, 4, 6, 8, 10, 12]
  for step in full:
    for routing in records.ROUTINGS:
      np.testing.assert_array_equal(resumed[step][routing], full[step][routing], err_msg=f"{step} {routing}")


def test_training_logs_gate_entropy_and_centroid_disagreement(recorded_run):
  config, workdir, _ = recorded_run
  logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  logged = {r["step"]: r for r in logged if "loss" in r}
  for step, r in logged.items():
    # Alive: the paper-scope collapse (README "Router health") drives this to ~0 (2e-7 passed the old range check).
    assert r["moe/moe_0/mean_gate"] >= 0.3, (step, r["moe/moe_0/mean_gate"])
    # Window means of per-step values: balance = entropy / ln 4 exactly; the mean of per-step maxima is at least
    # the largest window-mean load (Jensen), which is at least 1/4.
    assert r["moe/moe_0/load_balance"] == pytest.approx(r["moe/moe_0/load_entropy"] / np.log(4), rel=1e-5)
    assert 1.0 >= r["moe/moe_0/max_load"] >= max(r["moe/moe_0/load"]) - 1e-6 >= 0.25 - 1e-6
    if step <= 6:  # windows of stage-1 steps only: the centroids' argmax routes, nothing disagrees
      assert r["moe/moe_0/router/centroid_disagreement"] == 0.0
    if step >= 8:  # stage 2 only: the table routes, so disagreement with the argmax = 1 - distillation accuracy
      assert r["moe/moe_0/router/centroid_disagreement"] == pytest.approx(
          1.0 - r["moe/moe_0/router/distill_accuracy"], abs=1e-6)
      assert r["moe/moe_0/router/centroid_disagreement"] > 0.0


def test_analyze_mode_reproduces_the_final_cohesion_table(recorded_run, tmp_path):
  config, workdir, summary = recorded_run
  trained = {p.name: p.read_text() for p in (workdir / "analysis").iterdir() if p.suffix in (".json", ".md")}
  assert set(trained) == {"cohesion_valid_step12.json", "cohesion_valid_step12.md", "load_valid_step12.json",
                          "fluctuation.json"}
  shutil.rmtree(workdir / "analysis")
  result = analyze_checkpoint(config, workdir, split="valid")
  assert result["step"] == 12
  # Router health under the inference routing, and the contribution: the training summary's, same prefix.
  assert set(result["health"]["moe_0"]) == {"mean_gate", "low_gate_fraction", "load_balance", "max_load"}
  contribution = json.loads((workdir / "analysis" / "contribution_valid_step12.json").read_text())
  assert result["contribution"] == contribution and set(contribution["layers"]) == {"moe_0"}
  assert contribution == summary.health["contribution"]
  for name, text in trained.items():
    assert (workdir / "analysis" / name).read_text() == text, name
  assert (workdir / "analysis" / "fluctuation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # Independent count: StableMoE's inference routing is the frozen table of each input token id.
  _, state, _ = _restore(config, workdir)
  distilled = jax.device_get(state.params["moe_0"]["router"]["distilled_router"])
  table = np.argmax(distilled["embedding"] @ distilled["centroids"].T, axis=-1)
  from stablemoe_jax.data.lm import pipeline as data_lib
  lm_data = data_lib.load_lm_data(from_config(config).data, workdir / "data")
  stream = lm_data.stream("valid")
  inputs = stream.read(0, len(stream) - 1)  # every position that predicts a next token
  cohesion_json = json.loads(trained["cohesion_valid_step12.json"])["moe_0"]
  for row in cohesion_json:
    routed = inputs[table[inputs] == row["expert"]]
    assert row["tokens"] == len(routed)
    for entry in row["top"]:
      assert entry["count"] == np.sum(routed == entry["id"])
      assert entry["token"] == lm_data.tokenizer.id_to_token(entry["id"])
    if row["top"]:
      assert row["top"][0]["count"] == np.bincount(routed).max()
  # The test split too, and another checkpoint.
  earlier = analyze_checkpoint(config, workdir, step=8, split="test")
  assert (workdir / "analysis" / "cohesion_test_step8.md").is_file() and earlier["step"] == 8


def test_analyze_without_a_checkpoint_names_the_fix(recorded_run, tmp_path):
  config, workdir, _ = recorded_run
  shutil.copytree(workdir / "data", tmp_path / "data")
  with pytest.raises(FileNotFoundError, match="train first"):
    analyze_checkpoint(config, tmp_path)


def test_plot_command_draws_one_curve_per_run(recorded_run, tmp_path):
  _, workdir, _ = recorded_run
  other = tmp_path / "other_run"
  shutil.copytree(workdir / "routing", other / "routing")
  out = tmp_path / "fluctuation.png"
  result = subprocess.run([sys.executable, "-m", "stablemoe_jax.analysis.plot", str(workdir), str(other),
                           "--out", str(out), "--labels", "StableMoE,copy"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert "2 curve(s): StableMoE, copy" in result.stdout
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  result = subprocess.run([sys.executable, "-m", "stablemoe_jax.analysis.plot", str(tmp_path / "nothing"),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2 and "no routing records" in result.stderr and "Traceback" not in result.stderr

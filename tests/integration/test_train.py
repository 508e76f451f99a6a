"""The train loop on real data: the stage-1 freeze, exact resumption, evaluation, bad input."""
from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from tests.conftest import make_tiny_config, share_prepared_ptb

from stablemoe_jax.core.errors import NonFiniteLossError
from stablemoe_jax.experiment import loop
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config
from stablemoe_jax.experiment.step import make_train_step
from stablemoe_jax.core.errors import CheckpointMismatchError
from stablemoe_jax.train.checkpoint import abstract_like


def _distilled(params):
  return params["moe_0"]["router"]["distilled_router"]


def test_distilled_router_frozen_bit_for_bit_over_stage2_while_gate_learns(tiny_config, prepared_ptb, tmp_path):
  tiny_config.train.steps, tiny_config.train.stage1_steps = 9, 3
  share_prepared_ptb(prepared_ptb, tmp_path)
  exp = loop.Experiment(tiny_config, tmp_path)
  state = exp.init_state()
  step_fn = jax.jit(make_train_step(exp.model, exp.tx, exp.settings, exp.task))
  batches = exp.data.train_iterator(4, 16, seed=0)
  history = [jax.device_get(state.params)]
  stages = []
  for _ in range(9):
    state, metrics = step_fn(state, next(batches))
    history.append(jax.device_get(state.params))
    stages.append(int(metrics["stage"]))
  assert stages == [1, 1, 1, 2, 2, 2, 2, 2, 2]
  # Stage 1 trains the distilled router (update 1 has learning rate 0, the start of the warmup) ...
  for before, after in zip(history[1:3], history[2:4]):
    assert not np.array_equal(_distilled(before)["embedding"], _distilled(after)["embedding"])
  # ... and from the boundary on, it never moves by a single bit, though Adam's moments are non-zero.
  for later in history[4:]:
    jax.tree.map(np.testing.assert_array_equal, _distilled(history[3]), _distilled(later))
  # The gate's centroids and the experts keep learning in every stage-2 step.
  for before, after in zip(history[3:-1], history[4:]):
    assert not np.array_equal(before["moe_0"]["router"]["centroids"], after["moe_0"]["router"]["centroids"])
    assert not np.array_equal(before["moe_0"]["experts"]["w_out"], after["moe_0"]["experts"]["w_out"])


def _numpy_adam_updates(grads, lrs, b1, b2, eps):
  """Adam (Kingma & Ba, bias-corrected) in numpy: the update of each step for a fixed gradient sequence."""
  m = v = np.zeros_like(grads[0])
  updates = []
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    updates.append(-lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps))
  return updates


def test_optimizer_freezes_exactly_the_distilled_router_from_the_stage1_boundary_on():
  """Reference: numpy Adam with the hand-written schedule (lr = peak * c / warmup, then peak * (steps - c) /
  (steps - warmup) at update count c), global-norm clipping in numpy; the distilled router's update is exactly 0 from
  count stage1_steps on, every other leaf (also a sibling named like it) always gets its Adam update."""
  from stablemoe_jax.train import optimizer
  from stablemoe_jax.core.settings import TrainSettings
  cfg = TrainSettings(learning_rate=0.01, warmup_steps=2, steps=10, stage1_steps=4, adam_b1=0.9, adam_b2=0.98,
                      adam_eps=1e-8, clip_norm=1.0)
  params = {"moe_0": {"router": {"centroids": np.zeros(3, np.float32),
                                 "distilled_router": {"embedding": np.zeros(2, np.float32)}}},
            "distilled": np.zeros(2, np.float32)}  # not under a distilled_router: trained
  rng = np.random.default_rng(0)
  grads = [jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32) * 0.3, params) for _ in range(8)]
  tx = optimizer.make_optimizer(cfg)
  state = tx.init(params)
  got = []
  for g in grads:
    update, state = tx.update(g, state, params)
    got.append(jax.device_get(update))
  lrs = [0.01 * c / 2 if c < 2 else 0.01 * (10 - c) / 8 for c in range(8)]
  clipped = []
  for g in grads:
    norm = np.sqrt(sum(np.sum(np.square(x, dtype=np.float64)) for x in jax.tree.leaves(g)))
    clipped.append(jax.tree.map(lambda x: x * min(1.0, 1.0 / norm), g))
  leaf = {"centroids": lambda t: t["moe_0"]["router"]["centroids"],
          "embedding": lambda t: t["moe_0"]["router"]["distilled_router"]["embedding"],
          "distilled": lambda t: t["distilled"]}
  assert max(np.sqrt(sum(np.sum(x**2) for x in jax.tree.leaves(g))) for g in grads) > 1.0  # clipping matters
  for name, get in leaf.items():
    want = _numpy_adam_updates([get(g) for g in clipped], lrs, 0.9, 0.98, 1e-8)
    for count, (u, w) in enumerate(zip([get(u) for u in got], want)):
      if name == "embedding" and count >= cfg.stage1_steps:
        np.testing.assert_array_equal(u, 0.0, err_msg=f"{name} at count {count}")
      else:
        np.testing.assert_allclose(u, w, rtol=1e-4, atol=1e-9, err_msg=f"{name} at count {count}")
        assert count == 0 or np.abs(u).min() > 0, (name, count)  # count 0: learning rate 0 (warmup start)


def _restore_final(workdir, exp_config):
  manager = ocp.CheckpointManager((workdir / "checkpoints").absolute())
  step = manager.latest_step()
  exp = loop.Experiment(exp_config, workdir)
  abstract = abstract_like(exp.init_state())
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
  manager.close()
  exp.checkpointer.close()
  return step, restored["state"], restored["data"]


@pytest.fixture(scope="module")
def uninterrupted(ptb_dir, prepared_ptb, tmp_path_factory):
  config = make_tiny_config(ptb_dir)
  workdir = tmp_path_factory.mktemp("uninterrupted")
  share_prepared_ptb(prepared_ptb, workdir)
  summary = loop.train_and_evaluate(config, workdir)
  return config, workdir, summary


@pytest.mark.slow
def test_killed_and_resumed_run_equals_uninterrupted_run(uninterrupted, prepared_ptb, tmp_path):
  """Killed twice: after step 6 (it resumes from the checkpoint of step 4, in stage 1), then, resumed, after step 9
  (it resumes from step 8, in stage 2). The run that ends must equal the uninterrupted one bit for bit, so a fault
  in either resumption shows in the end state, the evaluations and the metrics file."""
  config, full_dir, full_summary = uninterrupted
  share_prepared_ptb(prepared_ptb, tmp_path)
  saved = lambda: sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert loop.train_and_evaluate(config, tmp_path, stop_at_step=6) == {"stopped_at_step": 6}
  assert saved() == [4]  # stage 1 (stage1_steps=5): the next run resumes from step 4
  assert loop.train_and_evaluate(config, tmp_path, stop_at_step=9) == {"stopped_at_step": 9}
  assert saved() == [4, 8]  # stage 2: the last run resumes from step 8
  resumed_summary = loop.train_and_evaluate(config, tmp_path)
  step_a, state_a, data_a = _restore_final(full_dir, config)
  step_b, state_b, data_b = _restore_final(tmp_path, config)
  assert step_a == step_b == 12 and int(state_a.step) == int(state_b.step) == 12
  jax.tree.map(np.testing.assert_array_equal, state_a.params, state_b.params)
  jax.tree.map(np.testing.assert_array_equal, state_a.opt_state, state_b.opt_state)
  assert data_a == data_b
  assert resumed_summary.valid == full_summary.valid and resumed_summary.test == full_summary.test
  # The metrics file reads as one run: each logged step once, losses equal to the uninterrupted run's.
  read = lambda d: [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
  train_records = lambda d: [r for r in read(d) if "loss" in r]
  assert [r["step"] for r in train_records(tmp_path)] == [2, 4, 6, 8, 10, 12]
  assert [r["loss"] for r in train_records(tmp_path)] == [r["loss"] for r in train_records(full_dir)]


@pytest.mark.slow
def test_finished_inverse_sqrt_run_extends_to_more_steps_as_a_longer_run(uninterrupted, prepared_ptb, tmp_path):
  """An inverse-sqrt schedule does not read train.steps: an 8-step run resumed with steps=12 ends bit for bit where
  a 12-step run does. A linear schedule does (its decay ends at train.steps): there the change is refused."""
  config = uninterrupted[0].copy_and_resolve_references()
  config.train.schedule = "inverse_sqrt"
  share_prepared_ptb(prepared_ptb, tmp_path / "whole", tmp_path / "extended")
  whole = loop.train_and_evaluate(config, tmp_path / "whole")
  short = config.copy_and_resolve_references()
  short.train.steps = 8
  assert loop.train_and_evaluate(short, tmp_path / "extended").steps == 8
  extended = loop.train_and_evaluate(config, tmp_path / "extended")
  (step_a, state_a, data_a), (step_b, state_b, data_b) = (_restore_final(tmp_path / d, config)
                                                          for d in ("whole", "extended"))
  assert step_a == step_b == 12
  jax.tree.map(np.testing.assert_array_equal, state_a.params, state_b.params)
  jax.tree.map(np.testing.assert_array_equal, state_a.opt_state, state_b.opt_state)
  assert data_a == data_b and extended.valid == whole.valid
  short.train.steps = 10  # shorter than the latest checkpoint
  with pytest.raises(CheckpointMismatchError, match="at step 12, past train.steps=10"):
    loop.train_and_evaluate(short, tmp_path / "extended")

  linear, linear_dir = uninterrupted[0].copy_and_resolve_references(), tmp_path / "linear"  # the 12-step linear run
  shutil.copytree(uninterrupted[1], linear_dir, symlinks=True)
  linear.train.steps = 16
  with pytest.raises(CheckpointMismatchError, match="train.steps: checkpoint 12, this config 16"):
    loop.train_and_evaluate(linear, linear_dir)


@pytest.mark.slow
def test_eval_mode_restores_checkpoint_and_reproduces_final_perplexity(uninterrupted):
  config, workdir, summary = uninterrupted
  result = loop.evaluate_checkpoint(config, workdir, split="test")
  assert result["step"] == 12 and result["perplexity"] == summary.test["perplexity"]
  # The tiny config's final evaluations score 4 batches of 64 x 16 tokens (eval.max_batches), and say so.
  assert summary.valid["tokens"] == result["tokens"] == 4 * 64 * 16 and summary.eval["max_batches"] == 4
  whole = config.copy_and_resolve_references()
  whole.eval.max_batches = 0  # every target of PTB's valid split but its first token: 73,760 - 1
  assert loop.evaluate_checkpoint(whole, workdir)["tokens"] == 73759
  earlier = loop.evaluate_checkpoint(config, workdir, step=4)
  assert earlier["perplexity"] > summary.valid["perplexity"]
  with pytest.raises(FileNotFoundError, match="available steps"):
    loop.evaluate_checkpoint(config, workdir, step=5)


@pytest.mark.slow
def test_checkpoint_from_another_config_is_refused(uninterrupted):
  config, workdir, _ = uninterrupted
  other = config.copy_and_resolve_references()
  other.model.d_model = 64
  with pytest.raises(CheckpointMismatchError, match="model.d_model: checkpoint 32, this config 64"):
    loop.evaluate_checkpoint(other, workdir)


@pytest.mark.slow  # ~30 s on 2 cores
def test_short_real_data_run_lowers_the_loss(tiny_config, prepared_ptb, tmp_path):
  share_prepared_ptb(prepared_ptb, tmp_path)
  tiny_config.model.d_model, tiny_config.model.d_ff = 64, 128
  tiny_config.train.steps, tiny_config.train.stage1_steps, tiny_config.train.warmup_steps = 60, 20, 5
  tiny_config.train.batch_size, tiny_config.train.log_every, tiny_config.train.eval_every = 8, 10, 1000
  tiny_config.train.checkpoint_every = 60
  loop.train_and_evaluate(tiny_config, tmp_path)  # its final evaluations: the first 4 batches of each split
  whole = tiny_config.copy_and_resolve_references()
  whole.eval.max_batches = 0  # the unigram below scores all of valid: so does the model (the step-60 checkpoint)
  valid = loop.evaluate_checkpoint(whole, tmp_path, split="valid")
  assert valid["step"] == 60 and valid["tokens"] == 73759
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  losses = [r["task_loss"] for r in records if "task_loss" in r]
  # The first window (steps 1-10, warmup 5) is about a uniform guess: log(10000) = 9.21 (measured 9.15).
  assert losses[0] == pytest.approx(np.log(10000), abs=0.2)
  assert losses[-1] < losses[0] - 1.5
  # Reference: the unigram model of the training split (numpy counts) scores 687 on valid. 60 steps of 128 tokens
  # get the model to 979 (1.42 x; 150 steps at lr 1e-2 reach 700): it must have learnt the word frequencies at least
  # roughly; a uniform guess is 10000, a model stuck at its start ~ e^9.
  unigram = _unigram_perplexity(tiny_config.data.data_dir)
  assert unigram == pytest.approx(687.0, abs=1.0)
  assert valid["perplexity"] < 1.5 * unigram
  assert [r["stage"] for r in records if "stage" in r] == [1, 1, 2, 2, 2, 2]
  load = np.array([r["moe/moe_0/load"] for r in records if "stage" in r])
  counts = load * 10 * 8 * 16  # a window's load: fractions of its 10 x 8 x 16 routed tokens
  np.testing.assert_allclose(counts, np.round(counts), atol=1e-3)
  np.testing.assert_allclose(load.sum(-1), 1.0, rtol=1e-5)


def _unigram_perplexity(data_dir):
  """Valid perplexity of the training split's unigram distribution (words and one <eos> a line), in numpy."""
  import collections
  import pathlib
  read = lambda split: [w for line in (pathlib.Path(data_dir) / "ptb" / f"ptb.{split}.txt").read_text().splitlines()
                        for w in [*line.split(), "<eos>"]]
  counts = collections.Counter(read("train"))
  total = sum(counts.values())
  valid = read("valid")[1:]  # every token but the first is predicted
  return float(np.exp(-np.mean([np.log(counts[w] / total) for w in valid])))


def test_nan_loss_stops_with_a_clear_error_and_keeps_no_bad_checkpoint(tiny_config, prepared_ptb, tmp_path):
  share_prepared_ptb(prepared_ptb, tmp_path)
  tiny_config.train.learning_rate = 1e38
  with pytest.raises(NonFiniteLossError, match="learning_rate"):
    loop.train_and_evaluate(tiny_config, tmp_path)
  manager = ocp.CheckpointManager((tmp_path / "checkpoints").absolute())
  for step in manager.all_steps():
    params = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]["params"]
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  manager.close()


@pytest.mark.parametrize("key, value, message", [
    ("train.stage1_steps", 13, "train.stage1_steps=13 must lie in"),
    ("model.moe.num_experts", 0, "num_experts=0 must be positive"),
    ("model.moe.capacity_factor", 0.0, "capacity_factor=0.0 must be > 0"),
    ("model.moe.placement", "sideways", "placement='sideways' is unknown"),
    ("train.seq_len", 32, "train.seq_len=32 must lie in"),
    ("eval.max_batches", -1, "eval.max_batches=-1 must be >= 0"),
])
def test_inconsistent_config_is_refused(tiny_config, key, value, message):
  section, name = key.rsplit(".", 1)
  node = tiny_config
  for part in section.split("."):
    node = node[part]
  node[name] = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
    validate_config(tiny_config)


def test_vocabulary_smaller_than_data_is_refused_before_compiling(tiny_config, prepared_ptb, tmp_path):
  share_prepared_ptb(prepared_ptb, tmp_path)
  tiny_config.model.vocab_size = 5000
  with pytest.raises(ConfigError, match=r"vocab_size=5000 is smaller than the tokenizer's vocabulary \(10000\)"):
    loop.Experiment(tiny_config, tmp_path)

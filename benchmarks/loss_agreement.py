"""Do dispatchers and compute dtypes train the same model? Loss curves from one init, against a reference.

  python -m benchmarks.loss_agreement [--config configs/default.py] [--config.x=y ...] [--steps 200]
      [--runs "name:key=value,...;..."] [--data synthetic|ptb]

Every run is the config plus its overrides, trained ``--steps`` steps with ``main``'s jitted train step
from the same initial parameters (same seed and shapes: a dispatcher or dtype changes neither) on the
same batches. The first run is the reference. One JSON line per run: its final losses and the max and
final absolute differences of its per-step losses (``loss``: the total with auxiliary losses;
``task_loss``: the LM cross-entropy) from the reference's.

Default runs: index dispatch in float32 (reference), one_hot and grouped (where ``models/dispatch.py``
has it) in float32, index (and grouped) in bfloat16. Dispatchers move the same rows to the same slots, so
they differ by float rounding only, which training then amplifies (Adam normalises tiny gradients); on CPU,
20 steps of configs/default.py gave one_hot vs index 5e-4 in task loss and bfloat16 vs float32 9e-3.
``--data synthetic``: a fixed random sparse bigram language (learnable, no data directory);
``--data ptb``: the config's corpus (``data.*``, ``$STABLEMOE_DATA_DIR``).
"""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile

import jax
import ml_collections
import numpy as np

from benchmarks.cases import Case, apply_overrides, parse_cases
from stablemoe_jax.experiment.config_validation import ConfigError, check_backend, validate_config
from stablemoe_jax.experiment.step import jit_train_step
from stablemoe_jax.models import dispatch as dispatch_lib
from stablemoe_jax.models.transformer import TransformerLM
from stablemoe_jax.parallel import mesh as mesh_lib
from stablemoe_jax.tasks.lm import LanguageModelTask
from stablemoe_jax.train.optimizer import make_optimizer
from stablemoe_jax.train.state import create_train_state, train_state_shardings
from stablemoe_jax.core.settings import from_config

SYNTHETIC_VOCAB = 1000
SUCCESSORS = 4  # each token of the synthetic language is followed by one of 4 tokens: ~1.4 nats at best


def default_runs() -> list[Case]:
  """index float32 (the reference), other dispatchers in float32, then bfloat16."""
  grouped = "grouped" in dispatch_lib.DISPATCHERS
  runs = [("index_fp32", "index", "float32"), ("one_hot_fp32", "one_hot", "float32")]
  runs += [("grouped_fp32", "grouped", "float32")] if grouped else []
  runs += [("index_bf16", "index", "bfloat16")] + ([("grouped_bf16", "grouped", "bfloat16")] if grouped else [])
  return [Case(name, {"model.moe.dispatcher": d, "model.dtype": t}) for name, d, t in runs]


def synthetic_batches(steps: int, batch_size: int, seq_len: int, vocab_size: int, seed: int = 0) -> list[dict]:
  """``steps`` train batches of a random sparse bigram language: every token has SUCCESSORS likely next tokens."""
  rng = np.random.default_rng(seed)
  successors = rng.integers(0, vocab_size, (vocab_size, SUCCESSORS))
  batches = []
  for _ in range(steps):
    tokens = np.empty((batch_size, seq_len + 1), np.int32)
    tokens[:, 0] = rng.integers(0, vocab_size, batch_size)
    choice = rng.integers(0, SUCCESSORS, (batch_size, seq_len))
    for t in range(seq_len):
      tokens[:, t + 1] = successors[tokens[:, t], choice[:, t]]
    batches.append({"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                    "weights": np.ones((batch_size, seq_len), np.float32)})
  return batches


def corpus_batches(config: ml_collections.ConfigDict, steps: int) -> tuple[list[dict], int]:
  """The first ``steps`` train batches of the config's corpus, and its vocabulary size."""
  from stablemoe_jax.core.settings import from_config
  from stablemoe_jax.data.lm import pipeline as data_lib  # needs the data pipeline's packages (grain); synthetic does not

  workdir = pathlib.Path(tempfile.mkdtemp(prefix="loss_agreement_"))
  data = data_lib.load_lm_data(from_config(config).data, workdir / "data")
  iterator = data.train_iterator(config.train.batch_size, config.train.seq_len, config.seed)
  return [next(iterator) for _ in range(steps)], data.vocab_size


def train_losses(config: ml_collections.ConfigDict, batches: list[dict]) -> dict[str, list[float]]:
  """Trains on ``batches`` (one step each) with ``main``'s train step: per-step ``loss`` and ``task_loss``."""
  validate_config(config)
  check_backend(config, jax.default_backend())
  mesh_lib.check_layout(config, jax.device_count())
  mesh = mesh_lib.make_mesh(config.mesh)
  run = from_config(config)
  model, tx = TransformerLM(run.model), make_optimizer(run.train)
  shardings = train_state_shardings(model, tx, config.train.seq_len, mesh)
  state = create_train_state(model, tx, config.seed, config.train.seq_len, mesh, shardings=shardings)
  init = float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(state.params)))
  step = mesh_lib.under_mesh(mesh, jit_train_step(model, tx, run, mesh, shardings, LanguageModelTask()))
  history = []
  for batch in batches:
    state, metrics = step(state, mesh_lib.to_global(mesh_lib.local_rows(batch), mesh))
    history.append(metrics)
  history = jax.device_get(history)
  return {"loss": [float(m["loss"]) for m in history], "task_loss": [float(m["task_loss"]) for m in history],
          "init_checksum": init}


def compare(base: ml_collections.ConfigDict, runs: list[Case], steps: int, data: str = "synthetic", emit=None):
  """Trains every run on the same batches; rows with each run's differences from the first run's losses."""
  config = ml_collections.ConfigDict(base.to_dict())
  if data == "ptb":
    batches, vocab = corpus_batches(config, steps)
  elif data == "synthetic":
    vocab = config.model.vocab_size or SYNTHETIC_VOCAB
    batches = synthetic_batches(steps, config.train.batch_size, config.train.seq_len, vocab, config.seed)
  else:
    raise ValueError(f"--data={data!r} is unknown; choose synthetic or ptb.")
  config.model.vocab_size = config.model.vocab_size or vocab
  rows, reference = [], None
  for run in runs:
    losses = train_losses(apply_overrides(config, run.overrides), batches)
    reference = reference or losses
    row = {"run": run.name, "overrides": run.overrides, "reference": runs[0].name, "steps": steps, "data": data,
           "same_init": losses["init_checksum"] == reference["init_checksum"]}
    for key in ("loss", "task_loss"):
      diff = np.abs(np.asarray(losses[key]) - np.asarray(reference[key]))
      row.update({f"final_{key}": losses[key][-1], f"max_abs_diff_{key}": float(diff.max()),
                  f"final_abs_diff_{key}": float(diff[-1])})
    row["first_task_loss"] = losses["task_loss"][0]
    rows.append(row)
    if emit:
      emit(row)
  return rows


def main() -> None:
  from absl import app, flags
  from ml_collections import config_flags

  config = config_flags.DEFINE_config_file("config", "configs/default.py", "Path to a configs/*.py file.")
  runs = flags.DEFINE_string("runs", "", "Runs separated by ';', each [name:]key=value[,key=value]; the first is "
                             "the reference. Default: index/one_hot/grouped in float32, index/grouped in bfloat16.")
  steps = flags.DEFINE_integer("steps", 200, "Train steps per run.")
  data = flags.DEFINE_enum("data", "synthetic", ["synthetic", "ptb"], "Training batches (see the module doc).")

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if steps.value < 1:
      raise app.UsageError("--steps must be >= 1")
    try:
      chosen = parse_cases(runs.value) if runs.value else default_runs()
      compare(config.value, chosen, steps.value, data.value, emit=lambda row: print(json.dumps(row), flush=True))
    except (ConfigError, ValueError) as error:
      print(f"error: {error}", file=sys.stderr)
      sys.exit(2)

  app.run(run)


if __name__ == "__main__":
  main()

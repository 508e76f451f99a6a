"""Checks a config for values that cannot work, before anything is built or compiled.

The whole-config check, above the modules that own each section: it checks the sections the training loop owns
(``task``, ``train``, ``eval``) and calls each owner's check in a fixed order (the first bad value found is the one
reported): ``models/checks.py`` (``model``, ``model.moe``, the routers, ``mesh.expert``), ``train/health.py``
(``health``), ``analysis/recorder.py`` (``analysis``), ``tasks/translation.py`` (``data``, ``decode`` of a
translation config). With ``device_count`` it adds what a launch on that many devices needs (the launch and
``--mode=plan`` call it alike); ``check_prepared`` stops a run whose corpus only ``python -m stablemoe_jax.prepare``
prepares, naming that command. Imported by the runners (``experiment/loop.py``, ``experiment/plan.py``) and the entry
points only.
"""
from __future__ import annotations

import pathlib

from stablemoe_jax.analysis import recorder as analysis_checks
from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.constants import TASK_NAMES, task_name
from stablemoe_jax.core.errors import ConfigError  # noqa: F401  (re-exported: raised by every check)
from stablemoe_jax.core.errors import DataNotFoundError
from stablemoe_jax.core.errors import require as _require
from stablemoe_jax.models import checks as model_checks
from stablemoe_jax.train import health as health_lib


def validate_config(config, data_vocab_size: int | None = None, device_count: int | None = None) -> None:
  """Raises ConfigError for the first bad value found.

  Args:
    config: the full run config.
    data_vocab_size: the tokenizer's vocabulary size, once known; checked
      against ``model.vocab_size``.
    device_count: the devices of a launch (``--mode=plan``: those planned for); adds every check of the layout
      (``model_checks.check_devices``, ``analysis_checks.check_devices``). ``model.moe.num_groups`` must then be
      resolved (``parallel.mesh.resolve_layout``): the launch and the plan make the same checks.
  """
  run = settings_lib.from_config(config)  # unknown keys and values of the wrong type first
  model, train, task = run.model, run.train, run.task
  _require(task in TASK_NAMES, f"task={task!r} is unknown; choose one of {TASK_NAMES}.")
  _require(train.steps > 0, f"train.steps={train.steps} must be positive.")
  _require(
      0 <= train.stage1_steps <= train.steps,
      f"train.stage1_steps={train.stage1_steps} must lie in [0, train.steps={train.steps}]; "
      f"set --config.train.stage1_steps to at most {train.steps} (the paper uses 10% of the steps).",
  )
  _require(0 <= train.warmup_steps < train.steps,
           f"train.warmup_steps={train.warmup_steps} must lie in [0, train.steps={train.steps}).")
  _require(train.batch_size > 0, f"train.batch_size={train.batch_size} must be positive.")
  _require(train.microbatches > 0 and train.batch_size % train.microbatches == 0,
           f"train.batch_size={train.batch_size} must be a positive multiple of "
           f"train.microbatches={train.microbatches}.")
  _require(train.learning_rate > 0, f"train.learning_rate={train.learning_rate} must be positive.")
  _require(train.router_lr_scale > 0,
           f"train.router_lr_scale={train.router_lr_scale} must be > 0 (1: the routers share the lr).")
  _require(train.router_warmup_steps >= 0,
           f"train.router_warmup_steps={train.router_warmup_steps} must be >= 0 (0: no router warmup).")
  for key in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    _require(getattr(train, key) > 0, f"train.{key}={getattr(train, key)} must be positive.")
  for section in ("train", "eval"):
    seq_len = getattr(run, section).seq_len
    _require(0 < seq_len <= model.max_len,
             f"{section}.seq_len={seq_len} must lie in (0, model.max_len={model.max_len}]; "
             f"raise --config.model.max_len or lower --config.{section}.seq_len.")
  stride = run.eval.stride
  _require(0 <= stride <= run.eval.seq_len,
           f"eval.stride={stride} must lie in [0, eval.seq_len={run.eval.seq_len}]; 0 or eval.seq_len scores "
           f"non-overlapping blocks, a smaller stride sliding windows (e.g. --config.eval.stride=64).")
  _require(run.eval.max_batches >= 0,
           f"eval.max_batches={run.eval.max_batches} must be >= 0 (0: the whole split).")
  model_checks.check_model(model, data_vocab_size)
  health_lib.check_config(run)
  analysis_checks.check_config(run)
  if device_count is not None:  # the layout before the groups' own checks: a resolved G names the devices it fits
    model_checks.check_devices(config, device_count)
  model_checks.check_moe(run)
  if task == "lm" and run.data.corpus == "facts":
    from stablemoe_jax.data.lm import facts  # pylint: disable=import-outside-toplevel
    facts.check_settings(run.data.facts, {"train.seq_len": run.train.seq_len, "eval.seq_len": run.eval.seq_len})
  if task == "lm" and run.data.eval_sets:
    from stablemoe_jax.data.lm import eval_sets  # pylint: disable=import-outside-toplevel
    eval_sets.parse(run.data)  # a bad data.eval_sets: one line, before any work
  if task == "translation":
    # Imported here: importing the translation task loads its input pipeline.
    from stablemoe_jax.tasks import translation as translation_task
    translation_task.check_config(run)
  if device_count is not None:
    analysis_checks.check_devices(run, device_count)


def _glob_overrides(data, keys: tuple[str, ...]) -> str:
  """`` --config.data.KEY=VALUE`` for each key: the config's value where it has one, else a placeholder."""
  placeholders = {"pairs": "xx-en,yy-en", "tfds_data_dir": "DIR"}
  values = [(key, getattr(data, key) or placeholders.get(key, "GLOB")) for key in keys]
  return "".join(f" --config.data.{key}='{value}'" for key, value in values)


def check_prepared(config, workdir, config_arg: str = "CONFIG") -> None:
  """Raises DataNotFoundError unless ``workdir/data`` holds the corpus of a config that only
  ``python -m stablemoe_jax.prepare`` prepares (``data.corpus=files`` of either task, WMT); one line naming that
  command with ``config_arg`` (the ``--config`` given), made before anything is written, prepared or compiled.
  Other corpora (PTB, ``text``, Multi30k + Bible) are prepared by the run itself."""
  data, prepared_dir = settings_lib.from_config(config).data, pathlib.Path(workdir) / "data"
  corpus, task = data.corpus, task_name(config)
  if task == "lm" and corpus == "files":
    from stablemoe_jax.data.lm import prepared  # pylint: disable=import-outside-toplevel
    if prepared.is_sharded(prepared_dir):
      return
    inputs = _glob_overrides(data, ("train_files", "valid_files", "test_files"))
  elif task == "translation" and corpus in ("files", "wmt"):
    from stablemoe_jax.data.translation import pipeline, wmt  # pylint: disable=import-outside-toplevel
    if (prepared_dir / "translation" / pipeline.MANIFEST).is_file():
      return
    if corpus == "wmt":
      wmt.require_prepared(data)  # the TFDS step first, where the network is
      inputs = _glob_overrides(data, ("tfds_data_dir",))
    else:
      inputs = _glob_overrides(data, ("pairs", "train_files", "valid_files", "test_files"))
  else:
    return
  raise DataNotFoundError(
      f"data.corpus={corpus!r} is read from shards that {prepared_dir} does not hold: prepare them first with "
      f"`python -m stablemoe_jax.prepare --config {config_arg} --workdir {workdir} --workers 8{inputs}` "
      f"(docs/data.md), then run this command again (the config's other overrides on both).")


def check_backend(config, backend: str) -> None:
  """Raises ConfigError if the config cannot run on JAX backend ``backend`` ("cpu", "gpu", "tpu").

  Separate from :func:`validate_config`, which cannot know the machine: call it where the model is built.
  """
  model_checks.check_backend(settings_lib.from_config(config).model, backend)

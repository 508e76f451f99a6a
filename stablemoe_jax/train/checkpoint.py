"""Orbax checkpoints of the train state, the data position and the config that wrote them."""
from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp

from stablemoe_jax.core.constants import task_name
from stablemoe_jax.core.errors import CheckpointMismatchError
from stablemoe_jax.core.settings import (LMDataSettings, ModelSettings, TrainSettings, TranslationDataSettings,
                                         absent_value, added_settings)
from stablemoe_jax.models.routers import without_added_settings

# Train settings that may change between a run and its resumption without changing its result.
_RESUMABLE_TRAIN_KEYS = ("log_every", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints")
# Schedules whose learning rate at a step does not depend on ``train.steps``: a finished run of one of them may be
# extended (resumed with a larger ``train.steps``) and continues as a run set that long from the start would.
_STEP_COUNT_FREE_SCHEDULES = ("inverse_sqrt",)


def _differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
  out = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += _differences(a, b, f"{prefix}{key}.")
    elif a != b:
      out.append(f"{prefix}{key}: checkpoint {a!r}, this config {b!r}")
  return out


# Model settings that choose how a result is computed across devices, not the result (like `mesh`, which
# is never compared): a checkpoint restores under any of their values.
_LAYOUT_MOE_KEYS = ("dispatcher", "eval_dispatcher", "block_size")
# Likewise how the model is computed on this machine (attention kernel, rematerialisation, the head's loss in
# chunks): the same parameters.
_IMPLEMENTATION_MODEL_KEYS = ("attention", "remat", "loss_chunk_tokens")
# Where the inputs lie on this machine (a run reads its prepared data from the workdir).
_DATA_LOCATION_KEYS = ("data_dir", "tfds_data_dir")
# Data keys added since checkpoints were written (their fields' ``added`` metadata), at the value those runs had.
_ADDED_DATA_SETTINGS = {**added_settings(LMDataSettings), **added_settings(TranslationDataSettings)}


def _comparable(config: dict, for_training: bool) -> dict:
  model = {k: v for k, v in config["model"].items() if k not in _IMPLEMENTATION_MODEL_KEYS}
  # model.vocab_multiple counts by the embedding rows it gives: a checkpoint written before the key (or with it
  # off) restores wherever it pads nothing, and one with padded rows only where the padding is the same.
  multiple = model.pop("vocab_multiple", absent_value(ModelSettings, "vocab_multiple"))
  if multiple > 1 and model.get("vocab_size", 0) % multiple:
    model["padded_vocab_size"] = -(-model["vocab_size"] // multiple) * multiple
  # Keys added since (model.moe.shared_experts, switch.top_k) at the value old runs had: equal to absent.
  model["moe"] = without_added_settings({k: v for k, v in model.get("moe", {}).items() if k not in _LAYOUT_MOE_KEYS})
  data = {k: v for k, v in config["data"].items()
          if k not in _DATA_LOCATION_KEYS and _ADDED_DATA_SETTINGS.get(k, object()) != v}
  sections = {"model": model, "data": data}
  sections["task"] = task_name(config)  # configs written before the key existed are language models
  if for_training:
    sections["seed"] = config["seed"]
    sections["train"] = {k: v for k, v in config["train"].items() if k not in _RESUMABLE_TRAIN_KEYS}
    train = sections["train"]
    schedule = train["schedule"] if "schedule" in train else absent_value(TrainSettings, "schedule")
    if schedule in _STEP_COUNT_FREE_SCHEDULES:
      del sections["train"]["steps"]
  return sections


class Checkpointer:
  """Saves and restores ``{state, data position, config}`` under ``directory`` with async saves.

  Args:
    directory: where the step folders go (created if absent).
    config: the run's resolved config; saved with every checkpoint and compared on restore.
    keep: how many recent checkpoints to keep.
  """

  def __init__(self, directory: pathlib.Path, config: ml_collections.ConfigDict, keep: int = 3):
    self._config = config.to_dict()
    self._manager = ocp.CheckpointManager(
        pathlib.Path(directory).absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=True),
    )

  @property
  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, data_state: dict | None) -> None:
    """Starts an async save of ``state`` and ``data_state`` (a grain iterator's ``get_state()``)."""
    self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state or {}),
            config=ocp.args.JsonSave(self._config),
        ),
    )

  def check_config(self, step: int, for_training: bool) -> None:
    """Raises CheckpointMismatchError if the checkpoint's config differs where it matters."""
    saved = self._manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
    diffs = _differences(_comparable(saved, for_training), _comparable(self._config, for_training))
    if diffs:
      raise CheckpointMismatchError(
          f"the checkpoint at step {step} in {self._manager.directory} was written with another config:\n  "
          + "\n  ".join(diffs)
          + "\nRun with the same config (or overrides) as that run, or use a new --workdir."
      )

  def restore(self, step: int, abstract_state: Any, for_training: bool = True) -> tuple[Any, dict]:
    """Returns ``(state, data_state)`` saved at ``step``; the state takes ``abstract_state``'s shardings."""
    available = self.all_steps()
    if step not in available:
      raise FileNotFoundError(
          f"no checkpoint for step {step} in {self._manager.directory}; available steps: {available}"
      )
    self.check_config(step, for_training)
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()),
    )
    return restored["state"], restored["data"]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


def complete_steps(directory: pathlib.Path) -> list[int]:
  """The steps of the complete checkpoints under ``directory``, ascending ([] when it holds none or does not exist).

  Read from the files (``STEP/config/metadata``, the JSON that ``Checkpointer.save`` writes; orbax names a step's
  folder by its number only once it is complete), not through a CheckpointManager: no collective and nothing
  created, so any process may call it before the run's Checkpointer exists, on any path."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit() and (p / "config" / "metadata").is_file())


def require_checkpoint(directory: pathlib.Path, step: int | None = None) -> None:
  """Raises FileNotFoundError (one line) unless ``directory`` holds a complete checkpoint, at ``step`` if given.

  What a mode that reads a checkpoint (eval, analyze, translate) checks first, before anything is built, prepared
  or written: a mistyped ``--workdir`` costs nothing and leaves nothing behind."""
  steps = complete_steps(directory)
  if not steps:
    raise FileNotFoundError(f"no checkpoint in {directory}; train first with --mode=train and this --workdir.")
  if step is not None and step not in steps:
    raise FileNotFoundError(f"no checkpoint for step {step} in {directory}; available steps: {steps}")


def saved_config(directory: pathlib.Path) -> dict | None:
  """The config saved with the latest complete checkpoint under ``directory`` (None: no checkpoint there), read
  from its files (:func:`complete_steps`)."""
  steps = complete_steps(directory)
  if not steps:
    return None
  return json.loads((pathlib.Path(directory) / str(steps[-1]) / "config" / "metadata").read_text())


def saved_num_groups(directory: pathlib.Path) -> int | None:
  """``model.moe.num_groups`` the run's latest checkpoint under ``directory`` was trained with (None: none saved).

  What ``model.moe.num_groups = 0`` (one group per device) resolves to when that run is resumed or evaluated."""
  saved = saved_config(directory)
  groups = ((saved or {}).get("model") or {}).get("moe", {}).get("num_groups")
  return int(groups) if groups else None


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs (with shardings) of a pytree of arrays, for restoring into it."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)

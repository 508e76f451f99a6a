"""Constants shared across layers (data, models, decoding, tasks, analysis): imported from here, defined once."""
from __future__ import annotations

# Special token ids of the translation task's joint sentencepiece model (``data/translation/joint_tokenizer.py``).
# Pad: source positions with it are masked, target positions with it unscored (``models/seq2seq.py``).
PAD_ID = 0
UNK_ID, BOS_ID, EOS_ID = 1, 2, 3  # bos starts the decoder input, eos ends source and target

# ``config.task``: the tasks (``tasks/``).
TASK_NAMES = ("lm", "translation")


def task_name(config) -> str:
  """``config.task`` of a config or a recorded one (a dict); configs written before the key existed are language
  models (``core.settings.RunSettings.task``)."""
  from stablemoe_jax.core.settings import RunSettings  # pylint: disable=import-outside-toplevel
  return config["task"] if "task" in config else RunSettings.task


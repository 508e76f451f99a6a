"""Constants shared across layers (data, models, decoding, tasks, analysis): imported from here, defined once."""
from __future__ import annotations

# Special token ids of the translation task's joint sentencepiece model (``data/translation/joint_tokenizer.py``).
# Pad: source positions with it are masked, target positions with it unscored (``models/seq2seq.py``).
PAD_ID = 0
UNK_ID, BOS_ID, EOS_ID = 1, 2, 3  # bos starts the decoder input, eos ends source and target

# ``config.task``: the tasks (``tasks/``).
TASK_NAMES = ("lm", "translation")


def task_name(config) -> str:
  """``config.task``; configs written before the key existed are language models."""
  return config.get("task", "lm")


# The defaults of the ``health`` config section (configs/default.py must equal them; config_validation checks keys).
# Read by the training guard (``train/health.py``) and the contribution analysis (``analysis/contribution.py``).
HEALTH_DEFAULTS = {
    "min_contribution": 0.01,  # dead: removing the layer costs less than this share of validation perplexity
    "max_top2_load": 0.9,  # dead: the two busiest experts (of N > 2) take more than this share of the tokens
    "min_gate_position": 0.05,  # warning: the mean gate this close to the floor of the range its router can reach
    "min_load_balance": 0.5,  # warning: load entropy / ln N below this
    "patience": 2,
    "after_step": -1,  # -1: train.warmup_steps
    "on_collapse": "warn",
    "contribution_batches": 20,
}

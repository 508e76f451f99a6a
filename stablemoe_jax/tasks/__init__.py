"""Tasks (``config.task``): language modelling and X->English translation over one shared loop.

See ``tasks/base.py`` for the interface the loop, steps and state use.
"""
from __future__ import annotations

TASK_NAMES = ("lm", "translation")


def task_name(config) -> str:
  """``config.task``; configs written before the key existed are language models."""
  return config.get("task", "lm")


def make_task(config):
  """The task object of ``config.task``."""
  name = task_name(config)
  if name == "lm":
    from stablemoe_jax.tasks.lm import LanguageModelTask
    return LanguageModelTask()
  if name == "translation":
    from stablemoe_jax.tasks.translation import TranslationTask
    return TranslationTask(config)
  raise ValueError(f"config.task={name!r} is unknown; choose one of {TASK_NAMES}.")

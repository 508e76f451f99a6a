"""Tasks (``config.task``): language modelling and X->English translation over one shared loop.

See ``tasks/base.py`` for the interface the loop, steps and state use.
"""
from __future__ import annotations

from stablemoe_jax.core.constants import TASK_NAMES, task_name  # noqa: F401  (re-exported)


def make_task(settings):
  """The task object of ``settings.task`` (the run's typed settings, ``RunSettings``)."""
  name = settings.task
  if name == "lm":
    from stablemoe_jax.tasks.lm import LanguageModelTask
    return LanguageModelTask()
  if name == "translation":
    from stablemoe_jax.tasks.translation import TranslationTask
    return TranslationTask(settings)
  raise ValueError(f"config.task={name!r} is unknown; choose one of {TASK_NAMES}.")

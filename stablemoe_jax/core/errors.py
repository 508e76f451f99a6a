"""User errors that several layers raise and the command-line entry points print as one line (``cli.py``)."""
from __future__ import annotations


class ConfigError(ValueError):
  """A config value is unknown or inconsistent; the message names the key and the fix."""


class NonFiniteLossError(FloatingPointError):
  """The training loss (or its gradient) became NaN or infinite at ``step``; the message names the last checkpoint
  and the settings to change."""

  def __init__(self, message: str, step: int | None = None):
    super().__init__(message)
    self.step = step


class CheckpointMismatchError(ValueError):
  """The checkpoint was written by a run with a different config."""


class CollapseError(RuntimeError):
  """A MoE layer is dead and ``health.on_collapse="stop"``; the message names the layer, numbers and cures."""


class DataNotFoundError(FileNotFoundError):
  """The corpus directory or one of its expected files does not exist."""


class DataError(ValueError):
  """A corpus file or the prepared data cannot be used; the one-line message names the file and the fix."""


def require(ok: bool, message: str) -> None:
  """Raises ConfigError(message) unless ``ok``: how each config section's owner checks its values."""
  if not ok:
    raise ConfigError(message)


def require_parses(parse, *args) -> None:
  """Runs a data module's own check; its ValueError (which names the fix) becomes a ConfigError."""
  try:
    parse(*args)
  except ValueError as error:
    raise ConfigError(str(error)) from None

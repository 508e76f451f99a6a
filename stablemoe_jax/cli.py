"""What every command-line entry point shares: flag parsing and user errors as one line with exit status 2."""
from __future__ import annotations

import sys
from typing import Callable

from absl import app, flags

from stablemoe_jax.core.errors import (CheckpointMismatchError, CollapseError, ConfigError, DataError, DataNotFoundError,
                                      NonFiniteLossError)

# Errors whose message names the problem and the fix; a traceback would add nothing.
USER_ERRORS = (ConfigError, DataError, DataNotFoundError, CheckpointMismatchError, NonFiniteLossError,
               CollapseError, FileNotFoundError)


def _parse_flags(argv: list[str]) -> list[str]:
  """Parses the flags so that a mistyped config key is one clear line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError, flags.Error) as error:
    message = str(error).strip("'\"").replace("\\n", " ").replace("\n", " ")
    print(f"error: bad flag or config override: {message}\n"
          f"Every config key is listed in the file given to --config.", file=sys.stderr)
    sys.exit(2)


def run_app(main: Callable[[list[str]], None]) -> None:
  """``absl.app.run(main)``; a user error ends it with its one-line message and exit status 2."""
  try:
    app.run(main, flags_parser=_parse_flags)
  except USER_ERRORS as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)

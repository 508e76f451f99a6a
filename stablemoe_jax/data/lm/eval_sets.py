"""Named held-out sets of a language model (``data.eval_sets``): each scored on its own, as extra splits.

``data.eval_sets = "NAME=GLOB,NAME=GLOB"`` ("" = none), where each GLOB holds ``{split}``, replaced by ``valid`` and
by ``test``: ``"ptb=corpus/{split}/ptb.txt,bible_en=corpus/{split}/bible_en.txt"``. ``prepare`` writes each set's
two files as the splits ``valid@NAME`` and ``test@NAME`` (``split_name``) beside train / valid / test, and the
run reports every set's valid and test perplexity at the end (``summary.json["sets"]``, ``tasks/lm.py``). Only the
``files`` corpus (the own-corpus path, ``configs/lm_files.py``) has them.
"""
from __future__ import annotations

import re

from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core.settings import LMDataSettings

SPLITS = ("valid", "test")  # the held-out splits every set has
_NAME = re.compile(r"[A-Za-z0-9_]+")
_EXAMPLE = "e.g. --config.data.eval_sets='ptb=corpus/{split}/ptb.txt,bible_en=corpus/{split}/bible_en.txt'"


def split_name(split: str, name: str) -> str:
  """The prepared split of set ``name``'s ``split`` file: ``valid@ptb`` (no '.', which shard names end at)."""
  return f"{split}@{name}"


def parse(data: LMDataSettings) -> dict[str, str]:
  """``{name: glob with {split}}`` of ``data.eval_sets``, in the order given ({} for "": no sets).

  Raises:
    ConfigError: an entry without ``NAME=GLOB``, a name that is not letters / digits / '_', a name given twice, a
      glob without ``{split}``, or sets on a corpus other than ``files`` (one line each, naming the fix).
  """
  entries = [e.strip() for e in data.eval_sets.split(",") if e.strip()]
  if not entries:
    return {}
  corpus = data.corpus
  if corpus != "files":
    raise ConfigError(f"data.eval_sets is read from shards that `python -m stablemoe_jax.prepare` writes: it "
                      f"needs data.corpus='files' (configs/lm_files.py), not {corpus!r}; or set data.eval_sets=''.")
  sets: dict[str, str] = {}
  for entry in entries:
    name, sep, pattern = (part.strip() for part in entry.partition("="))
    if not sep or not name or not pattern:
      raise ConfigError(f"data.eval_sets: {entry!r} is not NAME=GLOB; {_EXAMPLE}.")
    if not _NAME.fullmatch(name):
      raise ConfigError(f"data.eval_sets: set name {name!r} may hold only letters, digits and '_'; {_EXAMPLE}.")
    if name in sets:
      raise ConfigError(f"data.eval_sets names the set {name!r} twice; give each set one NAME=GLOB.")
    if "{split}" not in pattern:
      raise ConfigError(f"data.eval_sets: the glob of set {name!r} ({pattern!r}) has no {{split}}, which stands for "
                        f"valid and test; {_EXAMPLE}.")
    sets[name] = pattern
  return sets


def set_globs(data: LMDataSettings) -> dict[str, str]:
  """``{prepared split: glob}`` of every set's valid and test files (``valid@NAME``: its glob for ``valid``)."""
  return {split_name(split, name): pattern.replace("{split}", split)
          for name, pattern in parse(data).items() for split in SPLITS}

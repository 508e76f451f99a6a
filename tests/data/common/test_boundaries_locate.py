"""Locating the raw corpus at its edges (issue 51): a layout counts only whole; the configured data_dir before the
environment."""
from __future__ import annotations

import pathlib
import re

import pytest

from stablemoe_jax.core.errors import DataNotFoundError


# --- locating the raw corpus: a layout counts only whole ---------------------------------------------------------------

def _ptb_layout(root: pathlib.Path, nested: bool, splits=("train", "valid", "test")) -> None:
  folder = root / "ptb" if nested else root
  folder.mkdir(parents=True, exist_ok=True)
  for split in splits:
    (folder / f"ptb.{split}.txt").write_text("a b\n")


def test_a_ptb_layout_missing_one_split_is_not_accepted_and_the_missing_file_is_named(tmp_path):
  from stablemoe_jax.data.common import locate  # pylint: disable=import-outside-toplevel
  _ptb_layout(tmp_path, nested=True, splits=("train", "valid"))
  with pytest.raises(DataNotFoundError, match=re.escape(f"(missing: {tmp_path / 'ptb' / 'ptb.test.txt'})")):
    locate.corpus_files(tmp_path, "ptb")
  _ptb_layout(tmp_path, nested=False)  # the flat layout is whole: it is taken
  assert locate.corpus_files(tmp_path, "ptb")["test"] == tmp_path / "ptb.test.txt"
  _ptb_layout(tmp_path, nested=True)  # both whole: the nested one, most specific, first
  assert locate.corpus_files(tmp_path, "ptb")["train"] == tmp_path / "ptb" / "ptb.train.txt"


def test_the_configured_data_dir_comes_before_the_environment(tmp_path, monkeypatch):
  from stablemoe_jax.data.common import locate  # pylint: disable=import-outside-toplevel
  _ptb_layout(tmp_path / "configured", nested=False)
  monkeypatch.setenv(locate.ENV_VAR, str(tmp_path / "nowhere"))
  assert locate.resolve_data_dir(str(tmp_path / "configured")) == tmp_path / "configured"
  with pytest.raises(DataNotFoundError, match=re.escape(f"{tmp_path / 'nowhere'} (from ${locate.ENV_VAR})")):
    locate.resolve_data_dir("")

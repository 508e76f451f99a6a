"""commands/finished_run.py, shared by the declined and bias_share commands: the parser's defaults and choices, and
the percentage cell of a share that may be missing."""
from __future__ import annotations

import pytest

from stablemoe_jax.commands import finished_run


def test_parser_defaults_and_choices(capsys):
  parser = finished_run.parser_for("What it does.\n\nMore.", "batches of the training shape")
  args = parser.parse_args(["runs/a"])
  assert (str(args.run_dir), args.batches, args.split, args.step) == ("runs/a", 20, "valid", None)
  args = parser.parse_args(["runs/a", "--batches", "0", "--split", "test", "--step", "400"])
  assert (args.batches, args.split, args.step) == (0, "test", 400)
  assert parser.description == "What it does."
  with pytest.raises(SystemExit) as exit_info:
    parser.parse_args(["runs/a", "--split", "train"])
  assert exit_info.value.code == 2 and "invalid choice: 'train'" in capsys.readouterr().err


@pytest.mark.parametrize("value, cell", [(None, "--"), (0.0, "0.0%"), (0.125, "12.5%"), (1.0, "100.0%")])
def test_percent_of_a_missing_share_is_a_dash_and_zero_is_a_number(value, cell):
  assert finished_run.percent(value) == cell

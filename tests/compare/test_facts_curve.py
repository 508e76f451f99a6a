"""The facts regime's capacity curve (compare/facts_curve.py): points from hand-written summaries, the tables' cells
by hand, a folder without runs as a usage error, and the committed curve as its runs' summaries make it."""
from __future__ import annotations

import json

import pytest

from stablemoe_jax.compare import facts_curve
from tests.conftest import REPO

CALIBRATION = REPO / "results" / "facts_cpu" / "calibration"


def _run(root, name, lines, recall, nll, changed=None, kept=0.05, seconds=100.0, routed=False):
  run = root / name
  run.mkdir()
  final = {"facts/recall": recall, "facts/value_nll": nll, **({"facts/moe_0/value_experts": 3.0} if routed else {})}
  summary = {"train_seconds": seconds,
             "facts": {"lines": lines, "final": final,
                       "forgetting": {"p_forget_changed": changed, "p_forget_kept": kept}}}
  (run / "summary.json").write_text(json.dumps(summary))


def test_points_and_tables_by_hand(tmp_path):
  _run(tmp_path, "dense_a8", 800, 0.25, 2.0)
  _run(tmp_path, "dense_a4", 400, 0.875, 0.25, seconds=1234.4)
  _run(tmp_path, "switch_a8", 800, 0.5, 1.125, changed=0.375, kept=0.0625, routed=True)
  _run(tmp_path, "wider_a8", 800, 1.0, 0.0)  # the folder prefix of dense_wider
  _run(tmp_path, "dense_flops_a8", 800, 0.375, 1.5)  # a method whose name holds an underscore
  _run(tmp_path, "nosuchmethod_a8", 800, 0.5, 1.0)  # not a method: not a run of the curve
  (tmp_path / "notes").mkdir()  # not a run
  points = facts_curve.curve_points(tmp_path)
  assert list(points) == ["switch", "dense", "dense_wider", "dense_flops"]  # methods.py's order, not the folders'
  assert [p["run"] for p in points["dense"]] == ["dense_a4", "dense_a8"]  # by size
  text = facts_curve.markdown(points)
  dense = "| dense Transformer (same shared layers) |"
  assert "| model | 400 facts | 800 facts |" in text
  assert f"{dense} 87.5% (0.250) | 25.0% (2.000) |" in text
  assert "| Switch Transformer |  | 50.0% (1.125) |" in text  # no point at 400: an empty cell
  assert "| Switch Transformer | 37.5% / 6.2% |" in text  # the forgetting table: routed runs only, their sizes only
  assert "| dense wider (MoE total params) |  | 100.0% (0.000) |" in text
  assert "|  | 37.5% (1.500) |" in text  # dense_flops's row
  assert f"{dense} 1,234 | 100 |" in text
  assert text.count(dense) == 2  # recall and seconds, not forgetting


def test_written_files(tmp_path):
  runs = tmp_path / "runs"
  runs.mkdir()
  _run(runs, "stablemoe_a2", 200, 1.0, 0.0, changed=None, kept=0.0, routed=True)
  facts_curve.main([str(runs), "--out", str(tmp_path / "out")])
  assert json.loads((tmp_path / "out" / "capacity_curve.json").read_text())["stablemoe"][0]["recall"] == 1.0
  assert (tmp_path / "out" / "capacity_curve.png").stat().st_size > 1000
  assert "| StableMoE | -- / 0.0% |" in (tmp_path / "out" / "capacity_curve.md").read_text()


def test_a_folder_without_runs_is_a_usage_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    facts_curve.main([str(tmp_path)])
  assert exit_info.value.code == 2
  assert "holds no facts run" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    facts_curve.main([str(tmp_path / "missing")])


def test_the_committed_curve_is_its_runs():
  committed = CALIBRATION / "capacity_curve.md"
  assert committed.read_text() == facts_curve.markdown(facts_curve.curve_points(CALIBRATION))
  points = json.loads((CALIBRATION / "capacity_curve.json").read_text())
  assert points == json.loads(json.dumps(facts_curve.curve_points(CALIBRATION)))
  assert len({p["lines"] for model in points.values() for p in model}) >= 4  # issue 73: 4-6 corpus sizes


def test_readme_and_docs_show_the_committed_curve():
  """README's facts section and docs/facts.md hold the committed curve's recall and forgetting tables verbatim."""
  tables = [block for block in (CALIBRATION / "capacity_curve.md").read_text().split("\n\n")
            if block.startswith("| model |")]
  assert len(tables) == 3  # recall, forgetting, seconds
  for document in ("README.md", "docs/facts.md"):
    text = (REPO / document).read_text()
    for table in tables[:2]:
      assert table in text, f"{document}: the capacity curve's table is not the committed one:\n{table}"

"""Bit-identity check for behaviour-preserving refactors: the same runs before and after, compared leaf by leaf.

  python tools/bitcheck.py run OUT        # the three runs below into OUT/{lm,mt,deepseek} (~10 min on 2 busy cores)
  python tools/bitcheck.py compare A B    # every value of A's runs against B's; exit 1 on any difference
  python tools/bitcheck.py reports OUT [OLD_OUT]  # the reports regenerated into OUT/<name>/, diffed (bytes) with the
                                                 # committed ones and with the old code's OLD_OUT

The runs: the default LM (configs/default.py) for 50 steps (warmup 10) with stage 2 from step 26, a log window every 10 steps,
evaluations, checkpoints and routing records every 25 (each evaluation 2 batches); the tests' shared tiny
translation run (tests/mt_fixtures.py, routing records and greedy BLEU) for 30 steps; and the tests' tiny LM with
DeepSeek's router (its bias hook after every update) for 12 steps. ``compare`` checks every ``metrics.jsonl`` value
and every ``summary.json`` value except clock fields (seconds, tokens per second, the device), every checkpoint
leaf (orbax restore, ``np.array_equal``) with its data position and config, and the bytes of every other file
(config.json, the analysis reports and records, the tokenizer), TensorBoard event files excepted; the two run
folders' own paths (in configs and summaries) are read as one.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLOCK = re.compile(r"seconds|per_second|_time|^time$|^device$")  # keys whose values are the machine's, not the run's
SKIPPED_FILES = re.compile(r"events\.out\.tfevents|/checkpoints/|metrics\.jsonl$|summary\.json$")
REPORTS = {  # name: (preset, its committed report folder or None, the report's files)
    "tune_h100": ("configs/tune_cpu.py", "results/tune_h100", ("comparison.md", "comparison.json")),  # PTB
    "tune_mt_cpu": ("configs/tune_mt_cpu.py", "results/tune_mt_cpu", ("comparison.md", "comparison.json")),
    "tune_routers": ("configs/tune_routers_cpu.py", None, ("comparison.md", "comparison.json")),  # not committed
}


def _python(*args: str, cwd=ROOT) -> None:
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  subprocess.run([sys.executable, *args], cwd=cwd, env=env, check=True)


def run_lm(workdir: pathlib.Path) -> None:
  data_dir = os.environ["STABLEMOE_DATA_DIR"]
  _python("-m", "stablemoe_jax.main", "--config", "configs/default.py", "--workdir", str(workdir),
          f"--config.data.data_dir={data_dir}", "--config.train.steps=50", "--config.train.stage1_steps=25", "--config.train.warmup_steps=10",
          "--config.train.log_every=10", "--config.train.eval_every=25", "--config.train.eval_batches=2",
          "--config.train.checkpoint_every=25", "--config.eval.max_batches=2",
          "--config.health.contribution_batches=2", "--config.analysis.record_every=25",
          "--config.analysis.sample_tokens=1024")


def run_in_process(kind: str, workdir: pathlib.Path) -> None:
  """The tiny translation run or the tiny DeepSeek LM, in this process (their configs are the tests')."""
  from stablemoe_jax.experiment import loop  # pylint: disable=import-outside-toplevel
  from tests import conftest, mt_fixtures  # pylint: disable=import-outside-toplevel
  if kind == "mt":
    corpora = workdir.parent / "corpora"
    if not corpora.exists():
      mt_fixtures.write_small_corpora(corpora)
    config = mt_fixtures.shared_run_config(corpora)
    config.train.steps, config.train.stage1_steps, config.train.checkpoint_every = 30, 15, 10
    del config.compare
  else:
    config = conftest.make_tiny_config(pathlib.Path(os.environ["STABLEMOE_DATA_DIR"]) / "ptb")
    config.model.moe.router = "deepseek"
    config.model.moe.deepseek.bias_update_rate = 0.01
  loop.train_and_evaluate(config, workdir)


def _leaves(value, path=""):
  """(path, leaf) of a JSON value, clock keys left out."""
  if isinstance(value, dict):
    for key in sorted(value):
      if not CLOCK.search(str(key)):
        yield from _leaves(value[key], f"{path}/{key}")
  elif isinstance(value, list):
    for i, item in enumerate(value):
      yield from _leaves(item, f"{path}[{i}]")
  else:
    yield path, value


def _compare_json(a, b, where: str, problems: list[str], roots: tuple[str, str]) -> int:
  """Counts a's leaves; appends each difference (a string's run folder read as ROOT) to ``problems``."""
  left = {k: v.replace(roots[0], "ROOT") if isinstance(v, str) else v for k, v in _leaves(a)}
  right = {k: v.replace(roots[1], "ROOT") if isinstance(v, str) else v for k, v in _leaves(b)}
  for key in sorted(set(left) | set(right)):
    if key not in left or key not in right or left[key] != right[key]:
      problems.append(f"{where}{key}: {left.get(key, '<absent>')!r} != {right.get(key, '<absent>')!r}")
  return len(left)


def _checkpoint_leaves(step_dir: pathlib.Path) -> dict:
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  state = ocp.PyTreeCheckpointer().restore(step_dir / "state")
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def compare_runs(a: pathlib.Path, b: pathlib.Path) -> int:
  problems: list[str] = []
  roots = (str(a), str(b))  # the runs' folders, which paths in configs and summaries name: ROOT in both

  def read(path: pathlib.Path, root: str) -> bytes:
    return path.read_bytes().replace(root.encode(), b"ROOT")
  counts = {"metrics values": 0, "summary values": 0, "checkpoint leaves": 0, "other files": 0}
  for run in sorted(p.name for p in a.iterdir() if (p / "summary.json").is_file()):
    ra, rb = a / run, b / run
    rows_a = [json.loads(line) for line in (ra / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(line) for line in (rb / "metrics.jsonl").read_text().splitlines()]
    counts["metrics values"] += _compare_json(rows_a, rows_b, f"{run}/metrics.jsonl", problems, roots)
    counts["summary values"] += _compare_json(json.loads((ra / "summary.json").read_text()),
                                              json.loads((rb / "summary.json").read_text()),
                                              f"{run}/summary.json", problems, roots)
    steps_a = sorted(p.name for p in (ra / "checkpoints").iterdir() if p.name.isdigit())
    steps_b = sorted(p.name for p in (rb / "checkpoints").iterdir() if p.name.isdigit())
    if steps_a != steps_b:
      problems.append(f"{run}: checkpoint steps {steps_a} != {steps_b}")
    for step in steps_a:
      if step not in steps_b:
        continue
      la, lb = _checkpoint_leaves(ra / "checkpoints" / step), _checkpoint_leaves(rb / "checkpoints" / step)
      if set(la) != set(lb):
        problems.append(f"{run}/checkpoints/{step}: leaves {sorted(set(la) ^ set(lb))} in one only")
      for key in sorted(set(la) & set(lb)):
        counts["checkpoint leaves"] += 1
        if la[key].dtype != lb[key].dtype or not np.array_equal(la[key], lb[key]):
          problems.append(f"{run}/checkpoints/{step}{key}: arrays differ")
      for part in ("data", "config"):
        counts["checkpoint leaves"] += 1
        if (read(ra / "checkpoints" / step / part / "metadata", roots[0])
            != read(rb / "checkpoints" / step / part / "metadata", roots[1])):
          problems.append(f"{run}/checkpoints/{step}/{part}: differs")
    files_a = {str(p.relative_to(ra)) for p in ra.rglob("*") if p.is_file() and not SKIPPED_FILES.search(str(p))}
    files_b = {str(p.relative_to(rb)) for p in rb.rglob("*") if p.is_file() and not SKIPPED_FILES.search(str(p))}
    for name in sorted(files_a ^ files_b):
      problems.append(f"{run}/{name}: in one run only")
    for name in sorted(files_a & files_b):
      counts["other files"] += 1
      if read(ra / name, roots[0]) != read(rb / name, roots[1]):
        problems.append(f"{run}/{name}: bytes differ")
  print(", ".join(f"{n} {k}" for k, n in counts.items()) + " compared")
  for line in problems:
    print("DIFFERENT:", line)
  print("identical" if not problems else f"{len(problems)} differences")
  return 1 if problems else 0


def regenerate_reports(out: pathlib.Path, baseline: pathlib.Path | None) -> int:
  """Each report written again from the committed runs (``results/``, read only) into ``out/<name>``, compared byte
  for byte with the committed report and, given ``baseline`` (the same command's ``out`` of the old code), with it."""
  different = 0
  for name, (preset, committed, files) in REPORTS.items():
    _python("-m", "stablemoe_jax.compare", "--config", preset, "--workdir", str(out / name),
            "--config.compare.results_dir=" + (committed or "results/tune_h100"), "--config.compare.report_only=True")
    for f in files:
      written = (out / name / f).read_bytes()
      for label, other in (("the committed", ROOT / committed / f if committed else None),
                           ("the baseline's", baseline / name / f if baseline else None)):
        if other is not None:
          same = written == other.read_bytes()
          different += not same
          print(f"{out / name / f}: {'identical' if same else 'DIFFERENT'} to {label} {other}")
  return 1 if different else 0


def main(argv: list[str]) -> int:
  command, *args = argv
  if command == "run":
    out = pathlib.Path(args[0]).absolute()
    out.mkdir(parents=True, exist_ok=True)
    run_lm(out / "lm")
    for kind in ("mt", "deepseek"):
      _python(__file__, "_in_process", kind, str(out / kind))
    return 0
  if command == "_in_process":
    run_in_process(args[0], pathlib.Path(args[1]))
    return 0
  if command == "compare":
    return compare_runs(pathlib.Path(args[0]), pathlib.Path(args[1]))
  if command == "reports":
    return regenerate_reports(pathlib.Path(args[0]).absolute(),
                              pathlib.Path(args[1]).absolute() if len(args) > 1 else None)
  raise SystemExit(__doc__)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

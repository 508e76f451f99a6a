"""The multilingual LM probe's data and evaluation (issue 50, part 3): the union corpus written from the shared data
(``data/prepare/union_corpus.py``), per-set perplexity (``data.eval_sets``), the preset ``configs/lm_multi_cpu.py``.

Real data from ``STABLEMOE_DATA_DIR``. The references are read here independently of the code under test: the shared
files line by line (the Bible's books from ``keys.txt``), and each set's perplexity from the model's logits on rows
built here from the set's file, with a float64 log-softmax.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from tests.conftest import REPO, SHARED_DATA, make_tiny_config, tiny_flags

from configs import lm_files, lm_multi_cpu, mt_cpu
from stablemoe_jax.core.errors import ConfigError, DataError
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.data.lm import eval_sets
from stablemoe_jax.data.prepare import lm as lm_prepare
from stablemoe_jax.data.prepare import union_corpus
from stablemoe_jax.experiment.config_validation import validate_config


def _lines(path: pathlib.Path) -> list[str]:
  return [line.strip() for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


@pytest.fixture(scope="module")
def union_dir(tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("union")
  union_corpus.write_union_corpus(SHARED_DATA, out)
  return out


def _bible(books: set[str], inside: bool) -> dict[str, list[str]]:
  keys = (SHARED_DATA / "bible_es_en" / "keys.txt").read_text().split("\n")
  out = {}
  for language in ("en", "es"):
    verses = (SHARED_DATA / "bible_es_en" / f"bible.{language}").read_text(encoding="utf-8").split("\n")
    out[language] = [v.strip() for k, v in zip(keys, verses) if k and (k.split(".")[0] in books) == inside
                     and v.strip()]
  return out


def test_union_corpus_holds_each_sources_lines(union_dir):
  written = lambda name: _lines(union_dir / name)
  assert written("valid/ptb.txt") == _lines(SHARED_DATA / "ptb" / "ptb.valid.txt")
  assert written("test/ptb.txt") == _lines(SHARED_DATA / "ptb" / "ptb.test.txt")
  m30k = SHARED_DATA / "multi30k"
  for language in ("en", "de", "fr", "cs"):
    assert written(f"valid/multi30k_{language}.txt") == _lines(m30k / f"val.{language}")
    assert written(f"test/multi30k_{language}.txt") == _lines(m30k / f"test_2016_flickr.{language}")
    train, source = written(f"train/multi30k_{language}.txt"), _lines(m30k / f"train.{language}")
    assert len(train) == 29_000 and (train[0], train[-1]) == (source[0], source[-1])
  held_out = {"Ruth", "Jonah", "Phil", "Esth", "Jas", "1John"}
  for split, books, inside in (("valid", {"Ruth", "Jonah", "Phil"}, True), ("test", {"Esth", "Jas", "1John"}, True),
                               ("train", held_out, False)):
    for language, lines in _bible(books, inside).items():
      assert written(f"{split}/bible_{language}.txt") == lines, (split, language)
  manifest = json.loads((union_dir / "manifest.json").read_text())
  assert sorted(manifest["files"]) == sorted(f"{s}/{source}.txt" for s in ("train", "valid", "test")
                                             for source in union_corpus.SOURCES)
  for name, entry in manifest["files"].items():
    data = (union_dir / name).read_bytes()
    assert entry["md5"] == hashlib.md5(data).hexdigest() and entry["lines"] == data.count(b"\n"), name
  assert manifest["files"]["train/ptb.txt"]["lines"] == 42_068


def test_union_corpus_is_deterministic_and_agrees_with_the_presets(union_dir, tmp_path):
  again = union_corpus.write_union_corpus(SHARED_DATA, tmp_path)
  assert again == json.loads((union_dir / "manifest.json").read_text())
  data = mt_cpu.get_config().data
  assert (union_corpus.BIBLE_VALID_BOOKS, union_corpus.BIBLE_TEST_BOOKS) == (data.bible_valid_books,
                                                                             data.bible_test_books)
  assert lm_multi_cpu.SOURCES == union_corpus.SOURCES
  assert list(eval_sets.parse(from_config(lm_multi_cpu.get_config()).data)) == list(union_corpus.SOURCES)


def test_union_corpus_command_says_one_line_and_exits_2_on_a_bad_book(tmp_path, capsys):
  code = union_corpus.main(["--data_dir", str(SHARED_DATA), "--out", str(tmp_path), "--bible_valid_books=Nope"])
  error = capsys.readouterr().err
  assert code == 2 and error.count("\n") == 1 and "Nope" in error and not (tmp_path / "manifest.json").exists()


# ---- per-set perplexity -------------------------------------------------------------------------------------------
SETS = ("ptb", "multi30k_de", "bible_es")


def _small_config(corpus: pathlib.Path):
  """The tiny model on a few hundred lines of three sources, word tokenizer, every set scored whole."""
  config = make_tiny_config(SHARED_DATA)
  files = lm_files.get_config().data
  files.tokenizer = "word"
  config.data = files
  config.data.train_files = f"{corpus}/train/*.txt"
  config.data.valid_files = f"{corpus}/valid/*.txt"
  config.data.test_files = f"{corpus}/test/*.txt"
  config.data.eval_sets = ",".join(f"{name}={corpus}/{{split}}/{name}.txt" for name in SETS)
  config.eval.max_batches = 0
  return config


@pytest.fixture(scope="module")
def small_run(union_dir, tmp_path_factory):
  """(config, workdir) of the small corpus, prepared in one process (no Beam)."""
  root = tmp_path_factory.mktemp("small")
  corpus = root / "corpus"
  for split, count in (("train", 300), ("valid", 40), ("test", 25)):
    (corpus / split).mkdir(parents=True)
    for name in SETS:
      lines = (union_dir / split / f"{name}.txt").read_text().split("\n")[:count]
      (corpus / split / f"{name}.txt").write_text("\n".join(lines) + "\n")
  config = _small_config(corpus)
  lm_prepare.prepare(from_config(config).data, root / "run" / "data", lm_prepare.Options(workers=0, progress=False))
  return config, root / "run"


REFERENCE_ROWS = 160  # rows of the reference's one batch (every small set fits)


def _reference(exp, params, path: pathlib.Path) -> tuple[float, int]:
  """(mean NLL, predictions) over the file's stream (each line's ids + eos), from the logits of non-overlapping
  rows of eval.seq_len built here, in float64."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  tokenizer = exp.data.tokenizer
  stream = [i for line in _lines(path) for i in [*tokenizer.encode(line), tokenizer.eos_id]]
  inputs, targets = np.asarray(stream[:-1]), np.asarray(stream[1:])
  seq, rows = exp.config.eval.seq_len, REFERENCE_ROWS  # one shape for every file: one compile
  assert len(targets) <= rows * seq
  pad = rows * seq - len(targets)
  weights = np.concatenate([np.ones(len(targets)), np.zeros(pad)]).reshape(rows, seq)
  inputs, targets = (np.concatenate([a, np.zeros(pad, a.dtype)]).reshape(rows, seq) for a in (inputs, targets))
  apply = jax.jit(lambda p, x: exp.model.apply({"params": p}, x, jnp.array(False), deterministic=True).logits())
  logits = np.asarray(apply(params, jnp.asarray(inputs, jnp.int32)), np.float64)
  logits -= logits.max(-1, keepdims=True)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  return float((nll * weights).sum() / weights.sum()), int(weights.sum())


def test_each_sets_perplexity_equals_the_models_nll_over_its_own_stream(small_run):
  from stablemoe_jax.experiment import loop  # pylint: disable=import-outside-toplevel
  config, workdir = small_run
  exp = loop.Experiment(config, workdir)
  try:
    params = exp.init_state().params
    report = exp.task.final_report(exp.view(), params)
  finally:
    exp.checkpointer.close()
  corpus = pathlib.Path(config.data.train_files).parents[1]
  assert list(report["sets"]) == list(SETS)
  for name in SETS:
    assert list(report["sets"][name]) == ["valid", "test"]
    for split in ("valid", "test"):
      got = report["sets"][name][split]
      loss, tokens = _reference(exp, params, corpus / split / f"{name}.txt")
      assert got["tokens"] == tokens, (name, split)
      assert got["loss"] == pytest.approx(loss, rel=2e-5), (name, split)
      assert got["perplexity"] == pytest.approx(math.exp(loss), rel=5e-5)
  # The union's valid split is the sets' files, in name order: its predictions are theirs, less one per join.
  valid_tokens = sum(report["sets"][name]["valid"]["tokens"] + 1 for name in SETS) - 1
  assert exp.data.split_num_tokens("valid") - 1 == valid_tokens


@pytest.mark.parametrize("value, message", [
    ("ptb", "is not NAME=GLOB"),
    ("ptb=", "is not NAME=GLOB"),
    ("pt.b=x/{split}.txt", "may hold only letters, digits and '_'"),
    ("ptb=x/{split}.txt,ptb=y/{split}.txt", "names the set 'ptb' twice"),
    ("ptb=x/valid.txt", "has no {split}"),
])
def test_a_bad_eval_sets_value_is_one_line_before_any_work(value, message):
  config = lm_multi_cpu.get_config()
  config.data.eval_sets = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("{", r"\{")) as error:
    validate_config(config)
  assert "\n" not in str(error.value)


def test_eval_sets_need_the_files_corpus():
  config = make_tiny_config(SHARED_DATA)
  config.data.eval_sets = "ptb=x/{split}.txt"
  with pytest.raises(ConfigError, match="needs data.corpus='files'"):
    validate_config(config)


def test_a_glob_matching_nothing_stops_prepare(small_run, tmp_path):
  config, _ = small_run
  config = config.copy_and_resolve_references()
  config.data.eval_sets += f",lost={tmp_path}/{{split}}/none.txt"
  with pytest.raises(DataError, match=r"data.eval_sets \(valid@lost\): .* matches no file") as error:
    lm_prepare.prepare(from_config(config).data, tmp_path / "data", lm_prepare.Options(workers=0, progress=False))
  assert "\n" not in str(error.value) and not (tmp_path / "data").exists()


def _overrides(config) -> list[str]:
  data = config.data
  return ["--config.data.tokenizer=word", f"--config.data.train_files={data.train_files}",
          f"--config.data.valid_files={data.valid_files}", f"--config.data.test_files={data.test_files}",
          *tiny_flags(steps=2, stage1_steps=1, warmup_steps=1, log_every=1, checkpoint_every=2)]


def test_a_set_that_was_not_prepared_stops_main_with_exit_2(small_run):
  """The run's start names the set and the fix (exit 2, one line), before any compile or checkpoint."""
  config, workdir = small_run
  unprepared = config.data.eval_sets + f",extra={pathlib.Path(config.data.train_files).parents[1]}/{{split}}/ptb.txt"
  result = subprocess.run([sys.executable, "-m", "stablemoe_jax.main", "--config", "configs/lm_files.py",
                           "--workdir", str(workdir), *_overrides(config), f"--config.data.eval_sets={unprepared}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  error = result.stderr.strip().splitlines()
  assert len(error) == 1 and "valid@extra, test@extra" in error[0] and "python -m stablemoe_jax.prepare" in error[0]
  assert not (workdir / "metrics.jsonl").exists() and not list((workdir / "checkpoints").glob("*"))


@pytest.mark.slow
def test_the_preset_end_to_end_reports_every_sources_perplexity(tmp_path):
  """The preset's documented commands from a fresh folder, on the tiny model: union corpus -> prepare -> main."""
  (tmp_path / "configs").symlink_to(REPO / "configs", target_is_directory=True)
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
  run = lambda *args: subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, env=env, capture_output=True,
                                     text=True, timeout=900)
  small = ["--config.data.sentencepiece_vocab_size=600"]
  steps = [("stablemoe_jax.data.prepare.union_corpus", "--data_dir", str(SHARED_DATA), "--out", "runs/union_corpus"),
           ("stablemoe_jax.prepare", "--config", "configs/lm_multi_cpu.py", "--workdir", "runs/lm_multi",
            "--workers", "0", "--sentencepiece_sample_lines=20000", *small),
           ("stablemoe_jax.main", "--config", "configs/lm_multi_cpu.py", "--workdir", "runs/lm_multi", *small,
            *tiny_flags(steps=4, stage1_steps=2, warmup_steps=1, log_every=2, checkpoint_every=2))]
  for args in steps:
    result = run(*args)
    assert result.returncode == 0, f"{args[0]}:\n{result.stderr[-3000:]}"
  report = json.loads((tmp_path / "runs/lm_multi/data/prepare_report.json").read_text())["tokens"]
  summary = json.loads((tmp_path / "runs/lm_multi/summary.json").read_text())
  assert list(summary["sets"]) == list(union_corpus.SOURCES)
  scored = 4 * 32 * 16  # eval.max_batches x the preset's eval.batch_size x the tiny flags' eval.seq_len
  for source, splits in summary["sets"].items():
    for split in ("valid", "test"):
      assert splits[split]["tokens"] == min(scored, report[f"{split}@{source}"] - 1)
      assert math.isfinite(splits[split]["perplexity"]) and splits[split]["perplexity"] > 1
  # The union's valid split is the sets' valid files, in name order.
  assert report["valid"] == sum(report[f"valid@{s}"] for s in union_corpus.SOURCES)
  assert len({round(s["valid"]["loss"], 6) for s in summary["sets"].values()}) == len(union_corpus.SOURCES)

"""A user's own parallel files (`data.corpus = "files"`, configs/mt_files.py) through `prepare`, and the pair shards'
staleness, `--skip_bad_files` and line ends. Inputs: tiny slices of Multi30k written to tmp_path."""
from __future__ import annotations

import dataclasses
import gzip
import json

import numpy as np
import pytest
from tests.mt_fixtures import make_tiny_mt_config, multi30k_lines

from configs import mt_files
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.data.common import shards
from stablemoe_jax.data.common import text
from stablemoe_jax.data.prepare import lm as prepare
from stablemoe_jax.data.prepare import translation as prepare_translation
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.data.translation import corpora as parallel
from stablemoe_jax.data.translation import pipeline as data_lib
from stablemoe_jax.data.translation.joint_tokenizer import EOS_ID
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config

OPTIONS = prepare.Options(shard_pairs=150, batch_lines=64, workers=0, progress=False)
TRAIN_LINES = 240  # per training file; de-en has two, fr-en one (gzip)


def write_files_corpus(root):
  """root/{de-en,fr-en}/{train.00,train.01,valid,test}.{xx,en}: Multi30k lines (fr-en's train gzipped)."""
  for language, parts in (("de", 2), ("fr", 1)):
    folder = root / f"{language}-en"
    folder.mkdir(parents=True)
    files = {f"train.{k:02d}": ("train", k * TRAIN_LINES, TRAIN_LINES) for k in range(parts)}
    files.update(valid=("val", 0, 24), test=("test_2016_flickr", 0, 24))
    for stem, (corpus, start, count) in files.items():
      for side in (language, "en"):
        content = "".join(f"{line}\n" for line in multi30k_lines(f"{corpus}.{side}", start, count)).encode()
        if language == "fr" and stem.startswith("train"):
          (folder / f"{stem}.{side}.gz").write_bytes(gzip.compress(content, mtime=0))
        else:
          (folder / f"{stem}.{side}").write_bytes(content)
  return root


def files_config(root):
  """The tiny translation model (mt_fixtures) on configs/mt_files.py's data section over ``root``."""
  config = make_tiny_mt_config("")
  data = mt_files.get_config().data
  data.pairs = "de-en,fr-en"
  data.train_files = f"{root}/{{pair}}/train.*.{{lang}}*"  # plain and .gz
  data.valid_files = f"{root}/{{pair}}/valid.{{lang}}"
  data.test_files = f"{root}/{{pair}}/test.{{lang}}"
  data.sentencepiece_vocab_size = 400
  config.data = data
  return config


def _lines(path) -> list[str]:
  """The reference reading: '\\n'-ended lines, stripped (independent of the code under test)."""
  raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
  return [line.strip() for line in raw.decode("utf-8").split("\n")[:-1]]


def _shard_names(prepared_dir):
  return {p.name for p in (prepared_dir / "translation" / "shards").glob("*/*.array_record")}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  root = write_files_corpus(tmp_path_factory.mktemp("corpus"))
  config = files_config(root)
  prepared_dir = tmp_path_factory.mktemp("workdir") / "data"
  report = prepare_translation.prepare(from_config(config).data, prepared_dir, OPTIONS)
  return root, config, prepared_dir, report


def test_files_config_prepares_every_pair_and_set_as_the_files_hold_them(prepared):
  root, config, prepared_dir, report = prepared
  validate_config(config)
  data = data_lib.load_translation_data(from_config(config).data, prepared_dir)
  assert data.pairs == ("de-en", "fr-en")
  assert report["pairs"] == {"de-en": {"train": 2 * TRAIN_LINES, "valid": 24, "test": 24},
                             "fr-en": {"train": TRAIN_LINES, "valid": 24, "test": 24}}
  tokenizer = data.tokenizer
  for pair, language in (("de-en", "de"), ("fr-en", "fr")):
    folder = root / pair
    suffix = ".gz" if language == "fr" else ""
    trains = sorted(folder.glob(f"train.*.{language}{suffix}"))
    expected = {"train": ([l for p in trains for l in _lines(p)],
                          [l for p in trains for l in _lines(p.with_name(p.name.replace(f".{language}", ".en")))]),
                "valid": (_lines(folder / f"valid.{language}"), _lines(folder / "valid.en")),
                "test": (_lines(folder / f"test.{language}"), _lines(folder / "test.en"))}
    tag = tokenizer.tag_id(language)
    for name, (sources, targets) in expected.items():
      got = data.sets[pair][name]
      assert len(got) == len(sources) == len(targets)
      for i in range(0, len(got), 7):
        np.testing.assert_array_equal(got.source(i), [tag, *tokenizer.encode(sources[i]), EOS_ID])
        np.testing.assert_array_equal(got.target(i), tokenizer.encode(targets[i]))
      if name != "train":
        assert data.raw_text(pair, name) == (sources, targets)


def test_files_config_errors_are_one_line_before_any_work(tmp_path, prepared):
  root, config, _, _ = prepared
  for pairs in ("", "de_en", "de-en,fr-de", "de-en,de-en"):
    bad = config.copy_and_resolve_references()
    bad.data.pairs = pairs
    with pytest.raises(ConfigError, match="data.pairs"):
      validate_config(bad)
  bad = config.copy_and_resolve_references()
  bad.data.valid_files = f"{root}/{{pair}}/valid.en"
  with pytest.raises(ConfigError, match=r"data.valid_files=.* has no \{lang\}"):
    validate_config(bad)
  bad = config.copy_and_resolve_references()
  bad.data.test_files = f"{root}/{{pair}}/tset.{{lang}}"
  workdir = tmp_path / "data"
  with pytest.raises(shards.EmptyInputError) as error:
    prepare_translation.prepare(from_config(bad).data, workdir, OPTIONS)
  message = str(error.value)
  assert "\n" not in message and f"'{root}/de-en/tset.de' matches no file" in message
  assert "Fix --config.data.test_files=" in message and not workdir.exists()  # nothing was written


def test_mismatched_line_counts_name_both_files(tmp_path):
  root = write_files_corpus(tmp_path / "corpus")
  (root / "de-en" / "valid.en").write_text("one\ntwo\n", encoding="utf-8")
  config = files_config(root)
  with pytest.raises(shards.MisalignedError, match=r"valid\.de has 24 lines but .*valid\.en has 2"):
    prepare_translation.prepare(from_config(config).data, tmp_path / "data", OPTIONS)


def test_changed_input_or_tokenizer_setting_redoes_the_pair_shards(tmp_path):
  root = write_files_corpus(tmp_path / "corpus")
  config = files_config(root)
  prepared_dir = tmp_path / "data"
  first = prepare_translation.prepare(from_config(config).data, prepared_dir, OPTIONS)
  names = _shard_names(prepared_dir)
  assert first["shards_written"] == first["shards"] == len(names)

  # The same size and line count, another sentence: the file's md5 (and mtime) change its shards' names.
  changed = root / "de-en" / "valid.en"
  lines = changed.read_text(encoding="utf-8").split("\n")
  lines[3] = lines[3][::-1]
  changed.write_text("\n".join(lines), encoding="utf-8")
  second = prepare_translation.prepare(from_config(config).data, prepared_dir, OPTIONS)
  assert second["shards_written"] == 1 and second["shards_reused"] == len(names) - 1
  assert second["stale_files_removed"] == 2  # the old shard's records and its done marker
  assert len(_shard_names(prepared_dir) - names) == 1
  data = data_lib.load_translation_data(from_config(config).data, prepared_dir)
  np.testing.assert_array_equal(data.sets["de-en"]["valid"].target(3), data.tokenizer.encode(lines[3].strip()))
  assert data.raw_text("de-en", "valid")[1][3] == lines[3]

  config.data.sentencepiece_vocab_size = 350  # another tokenizer: no shard may be reused
  third = prepare_translation.prepare(from_config(config).data, prepared_dir, OPTIONS)
  assert third["shards_reused"] == 0 and third["shards_written"] == third["shards"]
  assert not _shard_names(prepared_dir) & names
  data = data_lib.load_translation_data(from_config(config).data, prepared_dir)
  assert data.vocab_size == 350
  manifest = json.loads((prepared_dir / "translation" / data_lib.MANIFEST).read_text())
  assert manifest["tokenizer_md5"] == data.tokenizer.fingerprint()


def test_skip_bad_files_leaves_out_a_pair_of_files_with_a_bad_line(tmp_path):
  root = write_files_corpus(tmp_path / "corpus")
  bad = root / "de-en" / "train.01.de"
  raw = bad.read_bytes().split(b"\n")
  raw[6] = raw[6] + " caf\u00e9".encode("latin-1")  # a Latin-1 byte on line 7
  bad.write_bytes(b"\n".join(raw))
  config = files_config(root)
  with pytest.raises(text.BadCorpusError) as error:
    prepare_translation.prepare(from_config(config).data, tmp_path / "stop", OPTIONS)
  assert f"{bad}, line 7" in str(error.value) and "\n" not in str(error.value)
  assert not (tmp_path / "stop" / "translation" / data_lib.MANIFEST).exists()

  report = prepare_translation.prepare(from_config(config).data, tmp_path / "skip",
                                       dataclasses.replace(OPTIONS, skip_bad_files=True))
  assert [f["path"] for f in report["skipped_files"]] == [str(bad)]
  assert f"{bad}, line 7" in report["skipped_files"][0]["error"]
  assert report["pairs"]["de-en"]["train"] == TRAIN_LINES  # train.00 only
  data = data_lib.load_translation_data(from_config(config).data, tmp_path / "skip")
  assert len(data.sets["de-en"]["train"]) == TRAIN_LINES
  first = _lines(root / "de-en" / "train.00.de")
  np.testing.assert_array_equal(data.sets["de-en"]["train"].source(TRAIN_LINES - 1)[1:-1],
                                data.tokenizer.encode(first[-1]))


def test_a_lone_carriage_return_stays_inside_its_line_in_both_paths(tmp_path):
  """Lines end at '\\n' (a CRLF's '\\r' stripped); a lone '\\r' is text. main's in-memory reading (parallel) and
  prepare's shards (shards.iter_aligned_pairs) give the same pairs, and the BLEU references round-trip."""
  data_dir = tmp_path / "corpora"
  (data_dir / "multi30k").mkdir(parents=True)
  for name, stem in parallel.multi30k_files("de").items():
    count = 300 if name == "train" else 12
    for side in ("de", "en"):
      lines = multi30k_lines(f"{'train' if name == 'train' else 'val'}.{side}", 0, count)
      if side == "de":
        lines[2] = lines[2].replace(" ", "\r", 1)  # a lone CR inside a source line
      lines[5] += "\r"  # a CRLF line end on both sides
      (data_dir / "multi30k" / f"{stem}.{side}").write_bytes("".join(f"{l}\n" for l in lines).encode())
  config = make_tiny_mt_config(data_dir)
  config.data.pairs = "de-en"
  config.data.sentencepiece_vocab_size = 300
  raw = parallel.read_sets(data_dir, ("de-en",), (), ())["de-en"]  # main's reading
  assert "\r" in raw["valid"].sources[2] and not raw["valid"].sources[5].endswith("\r")
  assert len(raw["valid"].sources) == len(raw["valid"].targets) == 12
  prepared_dir = tmp_path / "data"
  prepare_translation.prepare(from_config(config).data, prepared_dir, OPTIONS)
  data = data_lib.load_translation_data(from_config(config).data, prepared_dir)
  for name, ps in raw.items():
    expected = batch_lib.encode_set(data.tokenizer, ps)
    got = data.sets["de-en"][name]
    assert len(got) == len(expected)
    for i in range(len(got)):
      np.testing.assert_array_equal(got.source(i), expected.source(i))
      np.testing.assert_array_equal(got.target(i), expected.target(i))
    if name != "train":
      assert data.raw_text("de-en", name) == (list(ps.sources), list(ps.targets))
  # main's own .npz path writes and reads the same references.
  memory = data_lib.load_translation_data(from_config(config).data, tmp_path / "memory")
  assert memory.raw_text("de-en", "valid") == (list(raw["valid"].sources), list(raw["valid"].targets))


@pytest.mark.slow
def test_files_config_prepare_then_train(prepared):
  _, config, prepared_dir, _ = prepared
  from stablemoe_jax.experiment import loop
  workdir = prepared_dir.parent  # the workdir prepare wrote to
  config = config.copy_and_resolve_references()
  config.train.steps, config.train.stage1_steps = 6, 3
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 2, 1000, 1000
  config.eval.max_sentences = 8
  summary = loop.train_and_evaluate(config, workdir)
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "task_loss" in r][-1] == 6
  assert set(summary.pair_weights) == {"de-en", "fr-en"}
  data = data_lib.load_translation_data(from_config(config).data, prepared_dir)
  fitting = {p: len(data.sets[p]["train"].fitting(config.train.seq_len)) for p in data.pairs}
  assert summary.pair_weights["de-en"] == pytest.approx(fitting["de-en"] / sum(fitting.values()))
  assert set(summary.bleu["sets"]) == {"de-en", "fr-en"} and set(summary.bleu["sets"]["de-en"]) == {"test"}

"""The paper's WMT setting (configs/mt_wmt.py, data/translation/wmt.py): validated and planned offline; preparing or training
without its TFDS data stops with one line naming the builders; prepared TFDS records (small stand-ins in TFDS's own
array_record format, with WMT's features) become the translation sets, and a run trains on them."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds
from tests.conftest import REPO
from tests.mt_fixtures import make_tiny_mt_config, multi30k_lines

from configs import mt_wmt
from stablemoe_jax.core.errors import DataError
from stablemoe_jax.core.settings import from_config
from stablemoe_jax.data.prepare import lm as prepare
from stablemoe_jax.data.prepare import translation as prepare_translation
from stablemoe_jax.data.translation import pipeline as data_lib
from stablemoe_jax.data.translation import wmt
from stablemoe_jax.data.translation.joint_tokenizer import EOS_ID
from stablemoe_jax.experiment.config_validation import ConfigError, validate_config

MAIN = [sys.executable, "-m", "stablemoe_jax.main", "--config", "configs/mt_wmt.py"]


def test_wmt_config_is_valid_and_names_the_paper_pairs(tmp_path):
  config = mt_wmt.get_config()
  validate_config(config)
  assert config.data.pairs == "fr-en,cs-en,de-en,fi-en,lv-en,et-en,ro-en,hi-en,tr-en"
  assert wmt.builder_name("fr-en") == "wmt15_translate/fr-en:1.0.0"
  config.data.pairs = "fr-en,xx-en"
  with pytest.raises(ConfigError, match="unknown WMT pair.*xx-en"):
    validate_config(config)
  # A pair counts as prepared once TFDS wrote its dataset_info.json.
  config.data.pairs, config.data.tfds_data_dir = "fr-en,hi-en", str(tmp_path)
  (wmt.prepared_path(tmp_path, "hi-en")).mkdir(parents=True)
  (wmt.prepared_path(tmp_path, "hi-en") / "dataset_info.json").write_text("{}")
  assert wmt.missing_pairs(from_config(config).data) == ["fr-en"]


def _one_error_line(run: subprocess.CompletedProcess) -> str:
  assert run.returncode == 2, run.stderr[-2000:]
  assert "Traceback" not in run.stderr
  errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, run.stderr[-2000:]
  return errors[0]


@pytest.mark.slow
def test_wmt_offline_plans_and_stops_with_one_line(tmp_path):
  plan = subprocess.run([*MAIN, "--workdir", str(tmp_path / "plan"), "--mode=plan", "--plan_devices=8"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert plan.returncode == 0 and "plan: 8 devices" in plan.stdout, plan.stderr[-2000:]
  train = subprocess.run([*MAIN, "--workdir", str(tmp_path / "train")], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
  line = _one_error_line(train)
  assert "python -m stablemoe_jax.data.wmt" in line and "wmt14_translate/hi-en:1.0.0" in line
  prepare = subprocess.run([sys.executable, "-m", "stablemoe_jax.data.wmt", "--tfds_data_dir", str(tmp_path / "tfds"),
                            "--pairs=hi-en"], cwd=REPO, capture_output=True, text=True, timeout=300)
  line = _one_error_line(prepare)
  assert "wmt18_translate/tr-en:1.0.0" in line and "network" in line


# --- Reading prepared TFDS WMT records, offline: small builders in TFDS's own format stand in for the real ones.

OPTIONS = prepare.Options(shard_pairs=100, batch_lines=64, workers=0, progress=False)
# pair -> {TFDS split: (Multi30k file stem, first line, lines)}; fr-en has a "test" split and one extra split.
FAKE_SPLITS = {"de-en": {"train": ("train", 0, 260), "validation": ("val", 0, 12)},
               "fr-en": {"train": ("train", 300, 200), "validation": ("val", 12, 10),
                         "test": ("test_2016_flickr", 0, 8), "newstest_extra": ("test_2018_flickr", 0, 5)}}
SENTENCE_WITH_NEWLINE = ("Ein Mann\nsteht.", "A man\nstands.")  # a record whose text holds a newline (de-en train)


def fake_records(pair: str) -> dict[str, list[tuple[str, str]]]:
  """{TFDS split: [(source, target)]} of the stand-in builder of ``pair``."""
  source_language = pair.split("-")[0]
  out = {}
  for split, (stem, start, count) in FAKE_SPLITS[pair].items():
    out[split] = list(zip(multi30k_lines(f"{stem}.{source_language}", start, count),
                          multi30k_lines(f"{stem}.en", start, count)))
  if pair == "de-en":
    out["train"].append(SENTENCE_WITH_NEWLINE)
  return out


def write_fake_tfds(root: pathlib.Path, pair: str, records: dict[str, list[tuple[str, str]]],
                    file_format: str = "array_record") -> pathlib.Path:
  """Prepares a TFDS builder with WMT's features (``Translation``) from ``records`` and moves it to where the
  real builder of ``pair`` would be (``wmt.prepared_path``)."""
  languages = tuple(pair.split("-"))
  with tfds.core.registered.skip_registration():
    class FakeWmtTranslate(tfds.core.GeneratorBasedBuilder):  # pylint: disable=unused-variable
      VERSION = tfds.core.Version("1.0.0")

      # Defined in the package tests.data.translation: TFDS's default `code_path` would need the
      # `importlib_resources` backport (as for stablemoe_jax/data/lm/builder.py); this builder downloads nothing.
      @tfds.core.utils.classproperty
      @classmethod
      def code_path(cls):
        return pathlib.Path(__file__)

      def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(languages=languages))

      def _split_generators(self, dl_manager):
        return {split: self._generate_examples(rows) for split, rows in records.items()}

      def _generate_examples(self, rows):
        for i, (source, target) in enumerate(rows):
          yield i, {languages[0]: source, languages[1]: target}

  scratch = root / "scratch" / pair
  FakeWmtTranslate(data_dir=str(scratch), file_format="array_record").download_and_prepare()
  target = wmt.prepared_path(root, pair)
  shutil.rmtree(target, ignore_errors=True)
  target.parent.mkdir(parents=True, exist_ok=True)
  shutil.move(str(scratch / "fake_wmt_translate" / "1.0.0"), str(target))
  if file_format != "array_record":  # as if prepared in another format (writing tfrecord needs TensorFlow)
    info = json.loads((target / "dataset_info.json").read_text())
    info["fileFormat"] = file_format
    (target / "dataset_info.json").write_text(json.dumps(info))
  return target


def wmt_config(tfds_root: pathlib.Path):
  """The tiny translation model (mt_fixtures) on configs/mt_wmt.py's data section, de-en and fr-en."""
  config = make_tiny_mt_config("")
  data = mt_wmt.get_config().data
  data.pairs, data.tfds_data_dir, data.sentencepiece_vocab_size = "de-en,fr-en", str(tfds_root), 400
  config.data = data
  return config


@pytest.fixture(scope="module")
def prepared_wmt(tmp_path_factory):
  root = tmp_path_factory.mktemp("wmt")
  records = {pair: fake_records(pair) for pair in FAKE_SPLITS}
  for pair, splits in records.items():
    write_fake_tfds(root / "tfds", pair, splits)
  config = wmt_config(root / "tfds")
  validate_config(config)
  report = prepare_translation.prepare(from_config(config).data, root / "work" / "data", OPTIONS)
  return config, root, records, report


def test_prepare_reads_every_tfds_split_into_the_translation_sets(prepared_wmt):
  config, root, records, report = prepared_wmt
  want_sizes = {"de-en": {"train": 261, "valid": 12}, "fr-en": {"train": 200, "valid": 10, "test": 8,
                                                                 "newstest_extra": 5}}
  assert report["pairs"] == want_sizes
  prepared_dir = root / "work" / "data"
  data = data_lib.load_translation_data(from_config(config).data, prepared_dir)
  assert {p: sorted(named) for p, named in data.sets.items()} == {p: sorted(s) for p, s in want_sizes.items()}
  assert [s.name for s in data.split_sets("test")] == ["test", "newstest_extra"]  # both of fr-en, none of de-en
  clean = lambda rows: sorted((s.replace("\n", " "), t.replace("\n", " ")) for s, t in rows)
  names = {"train": "train", "validation": "valid"}
  for pair, splits in records.items():
    for split, rows in splits.items():
      name = names.get(split, split)
      if name != "train":  # evaluation sets: their raw text, for BLEU, is the records' text
        assert clean(zip(*data.raw_text(pair, name))) == clean(rows), (pair, name)
      # Every set's token ids are the joint tokenizer's encoding of the records (tag + source + eos, target).
      tokenizer, encoded = data.tokenizer, data.sets[pair][name]
      got = sorted((tuple(map(int, s)), tuple(map(int, t))) for s, t in encoded.pairs(range(len(encoded))))
      tag = tokenizer.tag_id(pair.split("-")[0])
      want = sorted((tuple([tag, *tokenizer.encode(s), EOS_ID]), tuple(tokenizer.encode(t))) for s, t in clean(rows))
      assert got == want, (pair, name)


def test_exported_splits_are_reused_until_the_tfds_data_changes(prepared_wmt):
  config, root, records, _ = prepared_wmt
  raw = root / "work" / "data" / "translation" / "raw"
  before = {p.name: p.stat().st_mtime_ns for p in raw.glob("*.src")}
  assert len(before) == 6
  prepare_translation.prepare(from_config(config).data, root / "work" / "data", OPTIONS)
  assert {p.name: p.stat().st_mtime_ns for p in raw.glob("*.src")} == before  # nothing re-read or rewritten
  changed = {split: list(rows) for split, rows in records["fr-en"].items()}
  changed["test"][0] = ("Une phrase changée.", "A changed sentence.")
  write_fake_tfds(root / "tfds", "fr-en", changed)
  prepare_translation.prepare(from_config(config).data, root / "work" / "data", OPTIONS)
  after = {p.name: p.stat().st_mtime_ns for p in raw.glob("*.src")}
  # A changed builder is exported again, each of its splits (its dataset_info.json changed); de-en is untouched.
  assert {name for name in before if after[name] != before[name]} == {
      "fr-en.train.src", "fr-en.valid.src", "fr-en.test.src", "fr-en.newstest_extra.src"}
  assert "Une phrase changée." in (raw / "fr-en.test.src").read_text(encoding="utf-8").splitlines()
  write_fake_tfds(root / "tfds", "fr-en", records["fr-en"])  # as the module's other tests expect
  prepare_translation.prepare(from_config(config).data, root / "work" / "data", OPTIONS)


def test_a_builder_prepared_as_tfrecord_is_one_line_naming_the_fix(tmp_path):
  write_fake_tfds(tmp_path / "tfds", "de-en", fake_records("de-en"), file_format="tfrecord")
  write_fake_tfds(tmp_path / "tfds", "fr-en", fake_records("fr-en"))
  config = wmt_config(tmp_path / "tfds")
  with pytest.raises(DataError, match=r"prepared as tfrecord.*--pairs=de-en") as error:
    prepare_translation.prepare(from_config(config).data, tmp_path / "work" / "data", OPTIONS)
  assert "\n" not in str(error.value)


@pytest.mark.slow
def test_wmt_prepare_then_train_and_translate(prepared_wmt):
  """A short run on the prepared WMT stand-ins: trains, evaluates and reports BLEU of fr-en's two test sets;
  the TFDS folder is not read again (training reads the workdir)."""
  from stablemoe_jax.experiment import loop
  config, root, _, _ = prepared_wmt
  config = config.copy_and_resolve_references()
  config.data.tfds_data_dir = str(root / "nowhere")
  config.train.steps, config.train.stage1_steps = 6, 3
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 2, 1000, 1000
  config.eval.max_sentences = 4
  summary = loop.train_and_evaluate(config, root / "work")
  assert set(summary.pair_weights) == {"de-en", "fr-en"}
  assert summary.pair_weights["de-en"] > summary.pair_weights["fr-en"]  # 261 pairs against 200
  assert set(summary.bleu["sets"]) == {"fr-en"} and set(summary.bleu["sets"]["fr-en"]) == {
      "test", "newstest_extra"}

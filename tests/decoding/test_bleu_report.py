"""``bleu_report`` with ``decode.sets`` at ``all`` and at ``primary``: which sets are decoded, the keys and values
written, on a tiny translation model and on a stand-in translator whose BLEU tells the sets apart."""
from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from tests.conftest import jit_init
from tests.mt_fixtures import tiny_model_config

from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.data.translation.joint_tokenizer import JointSentencePiece
from stablemoe_jax.data.translation.pipeline import TranslationData
from stablemoe_jax.data.translation.rows import EncodedSet
from stablemoe_jax.decoding import bleu_report as bleu_lib
from stablemoe_jax.models.seq2seq import TransformerSeq2Seq
from stablemoe_jax.tasks import translation as translation_task
from stablemoe_jax.core.settings import ModelSettings, from_config, typed

LINES = ["Ein Mann schläft.", "Zwei Hunde spielen im Schnee.", "Ein Kind isst.", "Eine Frau liest ein Buch.",
         "Un hombre duerme.", "Dos perros juegan.", "A man sleeps.", "Two dogs play in the snow."]
# Two sets per pair. de-en's primary set (test_2016_flickr) is its second; es-en has no set of PRIMARY_TEST_SETS
# and no "valid", so its first one (news_a) stands for it.
SETS = {"de-en": ("test_2017_flickr", "test_2016_flickr"), "es-en": ("news_a", "news_b")}
PRIMARY = {"de-en": "test_2016_flickr", "es-en": "news_a"}


class RecordingData(TranslationData):
  """TranslationData that records the sets whose text is read: the sets decoded, in order."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.read: list[tuple[str, str]] = []

  def raw_text(self, pair, name):
    self.read.append((pair, name))
    return super().raw_text(pair, name)


@pytest.fixture(scope="module")
def tokenizer():
  return JointSentencePiece.train([f"{line} {i}" for i in range(20) for line in LINES], vocab_size=60,
                                  languages=["de", "es"])


def _data(directory: pathlib.Path, tokenizer, references) -> RecordingData:
  """Each set: 3 sentences (source lines from LINES) written as a prepared corpus writes them; its references
  from ``references(pair, name, sources)``. The encoded arrays are empty: bleu_report reads only the raw text."""
  sets = {}
  for p, (pair, names) in enumerate(SETS.items()):
    for n, name in enumerate(names):
      sources = LINES[2 * p + n:2 * p + n + 3]
      (directory / f"{pair}.{name}.src.txt").write_text("".join(f"{s}\n" for s in sources), encoding="utf-8")
      (directory / f"{pair}.{name}.ref.txt").write_text(
          "".join(f"{r}\n" for r in references(pair, name, sources)), encoding="utf-8")
      empty = np.zeros((0,), np.int32)
      sets.setdefault(pair, {})[name] = EncodedSet(pair, name, empty, np.zeros(4, np.int64), empty,
                                                    np.zeros(4, np.int64))
  return RecordingData(tokenizer, sets, directory)


def _config(sets: str, vocab_size: int, max_len: int = 8):
  config = tiny_model_config(vocab_size)
  config.decode.beam_size, config.decode.max_len, config.decode.sets = 1, max_len, sets
  config.eval.max_sentences = 0
  return config


def test_primary_decodes_each_pairs_primary_set_only_on_a_tiny_model(tmp_path, tokenizer):
  every = _config("all", tokenizer.vocab_size)
  params = jit_init(TransformerSeq2Seq(typed(ModelSettings, every.model)), 0, jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32),
                    jnp.array(False))["params"]
  reports = {}
  for sets in ("all", "primary"):
    data = _data(tmp_path, tokenizer, lambda pair, name, sources: sources)
    reports[sets] = bleu_lib.bleu_report(from_config(_config(sets, tokenizer.vocab_size)), data, params, "test")
    reports[sets]["read"] = data.read
  assert reports["all"]["read"] == [(pair, name) for pair, names in SETS.items() for name in names]
  assert reports["primary"]["read"] == list(PRIMARY.items())
  assert reports["all"]["sets"].keys() == reports["primary"]["sets"].keys() == SETS.keys()
  for pair, names in SETS.items():
    assert list(reports["all"]["sets"][pair]) == list(names)
    assert list(reports["primary"]["sets"][pair]) == [PRIMARY[pair]]
  for sets, report in reports.items():
    assert report["decoded_sets"] == sets
    assert report["per_pair"] == {pair: report["sets"][pair][name] for pair, name in PRIMARY.items()}
    assert report["average"] == pytest.approx(np.mean(list(report["per_pair"].values())), abs=0.005)
  # The same model and decoding: each primary set scores the same whichever sets are decoded.
  assert reports["primary"]["per_pair"] == reports["all"]["per_pair"]


def _echo_translator(model_config, beam_size, max_len, length_penalty, mesh=None):
  """A stand-in translator: each source (tag, ids, eos) comes back as its ids: a line translates to itself."""
  del model_config, beam_size, length_penalty, mesh

  def translate(params, batch):
    del params
    out = np.zeros((batch.shape[0], max_len), np.int32)
    width = min(batch.shape[1] - 1, max_len)
    out[:, :width] = batch[:, 1:width + 1]
    return out, None
  return translate


def test_primary_reports_the_primary_sets_scores_not_another_sets(tmp_path, tokenizer, monkeypatch):
  # Echoed sources score 100 against themselves: the primary sets' references are their sources, the other sets'
  # references other sentences, so every value says which set it came from.
  monkeypatch.setattr(bleu_lib, "make_translate_fn", _echo_translator)
  references = lambda pair, name, sources: sources if PRIMARY[pair] == name else LINES[-len(sources):]
  for sets in ("all", "primary"):
    data = _data(tmp_path, tokenizer, references)
    report = bleu_lib.bleu_report(from_config(_config(sets, tokenizer.vocab_size, max_len=0)), data, None, "test")
    assert report["per_pair"] == {"de-en": pytest.approx(100.0), "es-en": pytest.approx(100.0)}
    assert report["average"] == pytest.approx(100.0)
    others = [report["sets"][pair][name] for pair, names in SETS.items() for name in names if PRIMARY[pair] != name
              if name in report["sets"][pair]]
    assert len(others) == (2 if sets == "all" else 0) and all(score < 50 for score in others)


@pytest.mark.parametrize("value", ["all", "primary"])
def test_both_decode_sets_values_pass_the_config_check(value):
  config = tiny_model_config()
  config.decode.sets = value
  translation_task.check_config(from_config(config))


@pytest.mark.parametrize("value", ["Primary", "", "primary "])
def test_other_decode_sets_values_are_one_config_error_naming_the_key(value):
  config = tiny_model_config()
  config.decode.sets = value
  with pytest.raises(ConfigError, match=rf"decode.sets={value!r} is unknown; choose one of \('all', 'primary'\)"):
    translation_task.check_config(from_config(config))

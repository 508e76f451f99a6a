"""The ``data`` section, one frozen dataclass per task: a language model's corpus (``LMDataSettings``) and a
translation model's pairs (``TranslationDataSettings``). The defaults are the CPU presets' (configs/default.py and
configs/mt_cpu.py are built from them); a corpus's own keys (``carried=()``) are in a config only where a preset
states them (configs/lm_files.py, configs/facts_cpu.py, configs/mt_files.py, configs/mt_wmt.py). The checks stay
with their readers (``data/lm/``, ``data/translation/``, ``tasks/translation.py``)."""
from __future__ import annotations

import dataclasses

from stablemoe_jax.core.settings.routers import section, setting

_STATED = ()  # ``carried``: only a preset that states the key holds it
_DATA_DIR = setting("", "the folder holding the raw corpus (translation: multi30k/ and bible_es_en/); '': "
                        "$STABLEMOE_DATA_DIR")
_VOCAB = setting(8000, "sentencepiece pieces (translation: one joint model over sources and targets)")


def _globs(split: str):
  return setting("", f"corpus=files: comma-separated globs of the {split} text (translation: with {{lang}}, and "
                     f"{{pair}} where the pairs differ)", carried=_STATED)


@dataclasses.dataclass(frozen=True)
class FactsSettings:
  """``data.facts`` of ``data.corpus=facts``: a synthetic corpus of (entity, attribute) -> value facts, generated from
  its own seed (the same facts for every run seed), nothing downloaded (``data/lm/facts.py``, docs/facts.md)."""

  seed: int = setting(0, "the corpus's own seed: which entities exist and every fact's value")
  first_names: int = setting(40, "first-name pieces; an entity is a (first, last) pair, never a token of its own")
  last_names: int = setting(40, "last-name pieces")
  entities: int = setting(1600, "entities, distinct (first, last) pairs drawn from first_names x last_names")
  attributes: int = setting(4, "attributes per entity; every entity has a value for each")
  attribute_values: int = setting(64, "distinct values each attribute takes (log2 of it: the bits of a fact)")
  value_pieces: int = setting(64, "value tokens in the vocabulary; a value is value_tokens of them")
  value_tokens: int = setting(1, "tokens of one value (attribute_values <= value_pieces ** value_tokens)")
  templates: int = setting(1, "phrasings of each attribute (its own attribute token each); every fact is trained in "
                              "every phrasing")
  layout: str = setting("attribute_first", "attribute_first: '<attr> <first> <last> <value>' (the token before the "
                                           "value is a name piece) | name_first: '<first> <last> <attr> <value>' "
                                           "(it is the attribute)")


@dataclasses.dataclass(frozen=True)
class LMDataSettings:
  """``data`` of ``task=lm``: the corpus and its tokenizer (docs/data.md)."""

  corpus: str = setting("ptb", "ptb | text (a user's train/valid/test.txt in data_dir) | files (globs, read from "
                               "the shards `stablemoe_jax.prepare` writes) | facts (synthetic facts, data.facts)")
  data_dir: str = _DATA_DIR
  tokenizer: str = setting("word", "word | sentencepiece")
  sentencepiece_vocab_size: int = _VOCAB
  train_files: str = _globs("train")
  valid_files: str = _globs("validation")
  test_files: str = _globs("test")
  tokenizer_files: str = setting("", "corpus=files: globs of the train files the tokenizer is built from; '': all",
                                 carried=_STATED)
  eval_sets: str = setting("", "corpus=files: 'NAME=GLOB with {split},...': more held-out sets, scored as "
                               "valid@NAME / test@NAME (data/lm/eval_sets.py); '': none", carried=_STATED)
  facts: FactsSettings = section(FactsSettings, "corpus=facts: the synthetic fact corpus", carried=_STATED)


@dataclasses.dataclass(frozen=True)
class TranslationDataSettings:
  """``data`` of ``task=translation``: the pairs, their tokenizer and how training batches are drawn
  (docs/translation.md)."""

  corpus: str = setting("multi30k_bible", "multi30k_bible (the shared Multi30k + Bible) | wmt (TFDS builders) | "
                                          "files (a user's parallel files)", carried=_STATED)
  data_dir: str = _DATA_DIR
  pairs: str = setting("de-en,fr-en,cs-en,es-en", "comma-separated SOURCE-TARGET pairs, one target language")
  bible_valid_books: str = setting("Ruth,Jonah,Phil", "multi30k_bible: the Bible books held out for validation")
  bible_test_books: str = setting("Esth,Jas,1John", "multi30k_bible: the Bible books held out for test")
  sentencepiece_vocab_size: int = _VOCAB
  sampling_temperature: float = setting(1.0, "pair weight ~ n_pair^(1/T); 1: proportional to its training pairs")
  length_buckets: int = setting(3, "training batch lengths (..., L/4, L/2, L): this many, each batch of one "
                                   "bucket L, [B * seq_len / L, L] (the same positions a step, so a short pair "
                                   "fills more of its row; docs/translation.md); 1: every batch [B, seq_len]",
                                absent=1)
  pack_pairs: bool = setting(False, "True: pairs drawn in turn packed into the batch's rows until one fits no row, "
                                    "each attending only within its own pair (docs/translation.md); needs "
                                    "length_buckets=1", added=True)
  train_files: str = _globs("train")
  valid_files: str = _globs("validation")
  test_files: str = _globs("test")
  tfds_data_dir: str = setting("", "corpus=wmt: where the TFDS WMT builders were prepared", carried=_STATED)


def data_settings_class(task: str) -> type:
  """The ``data`` dataclass of task ``task`` (an unknown task reads as a language model; its own check names it)."""
  return TranslationDataSettings if task == "translation" else LMDataSettings

"""The synthetic fact corpus (``data.corpus=facts``, stablemoe_jax/data/lm/facts.py): determinism, the two layouts,
names from shared pieces, the per-epoch reshuffle and exact resume, evaluation rows and value positions, bad
settings. No model, no training."""
from __future__ import annotations

import re

import numpy as np
import pytest

from configs import facts_cpu
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core.settings import FactsSettings
from stablemoe_jax.data.lm import facts
from stablemoe_jax.data.lm.token_counts import split_token_counts
from stablemoe_jax.experiment import config_validation

SMALL = FactsSettings(first_names=5, last_names=4, entities=12, attributes=3, attribute_values=6, value_pieces=4,
                      value_tokens=2, templates=2)


def _decode(corpus: facts.FactsCorpus, line: np.ndarray) -> list[str]:
  return [corpus.tokens[i] for i in line]


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_facts():
  a, b = facts.generate(SMALL), facts.generate(SMALL)
  assert a.tokens == b.tokens and a.lines.tobytes() == b.lines.tobytes()
  other = facts.generate(FactsSettings(**{**SMALL.__dict__, "seed": 1}))
  assert other.tokens == a.tokens  # the vocabulary is the settings', not the seed's
  assert other.lines.shape == a.lines.shape and not np.array_equal(other.values(), a.values())


@pytest.mark.parametrize("layout, before_value", [("attribute_first", "L"), ("name_first", "A")])
def test_each_layout_puts_its_token_before_the_value(layout, before_value):
  corpus = facts.generate(FactsSettings(**{**SMALL.__dict__, "layout": layout}))
  for line in corpus.lines:
    words = _decode(corpus, line)
    assert words[-1] == "<eos>" and all(w.startswith("V") for w in words[3:-1]) and len(words) == 3 + 2 + 1
    assert words[facts.LINE_PREFIX - 1][0] == before_value  # the token that predicts the value's first token
    first, last, attr = (words[1], words[2], words[0]) if layout == "attribute_first" else words[:3]
    assert (first[0], last[0], attr[0]) == ("F", "L", "A")


def test_names_are_pairs_of_shared_pieces_and_facts_agree_across_phrasings():
  corpus = facts.generate(SMALL)
  # no token per entity: the vocabulary is eos + pieces + attribute phrasings + value pieces, whatever the entities
  assert len(corpus.tokens) == 1 + 5 + 4 + 3 * 2 + 4
  entities = {tuple(e) for e in corpus.entity}
  assert len(entities) == 12 and all(0 <= f < 5 and 0 <= l < 4 for f, l in entities)
  assert corpus.num_lines == 12 * 3 * 2
  by_fact: dict[tuple, set] = {}
  for entity, attribute, value in zip(map(tuple, corpus.entity), corpus.attribute, map(tuple, corpus.values())):
    by_fact.setdefault((entity, int(attribute)), set()).add(value)
  assert len(by_fact) == 12 * 3 and all(len(v) == 1 for v in by_fact.values())  # one value, every phrasing
  for attribute in range(3):  # each attribute's values come from its own set of `values` spellings
    spelled = {v for (e, a), vs in by_fact.items() if a == attribute for v in vs}
    assert len(spelled) <= 6


def test_training_batches_reshuffle_every_epoch_and_resume_exactly():
  data = facts.FactsData(SMALL)  # 72 lines of 6 tokens
  n = data.corpus.num_lines
  iterator = data.train_iterator(batch_size=4, seq_len=18, seed=3)  # 3 lines a row, 12 a batch: 6 batches an epoch
  batches = [next(iterator) for _ in range(12)]
  rows = np.concatenate([b["inputs"] for b in batches])
  assert (rows[:, 0] == 0).all() and all((b["weights"] == 1).all() for b in batches)
  # each row: eos, then 3 whole lines; its targets are the 3 lines, eos last
  seen = [tuple(x) for x in np.concatenate([b["targets"] for b in batches]).reshape(-1, 6)]
  line_set = [tuple(x) for x in data.corpus.lines]
  first, second = seen[:n], seen[n:]
  assert sorted(first) == sorted(line_set) and sorted(second) == sorted(line_set)  # every line once an epoch
  assert first != second  # a fresh permutation each epoch
  resumed = data.train_iterator(batch_size=4, seq_len=18, seed=3)
  resumed.set_state({"next_index": 7})
  assert iterator.get_state() == {"next_index": 12}
  assert np.array_equal(next(resumed)["inputs"], batches[7]["inputs"])
  other_seed = next(data.train_iterator(batch_size=4, seq_len=18, seed=4))
  assert not np.array_equal(other_seed["inputs"], batches[0]["inputs"])


def test_process_shards_concatenate_to_the_single_process_batch():
  data = facts.FactsData(SMALL)
  whole = next(data.train_iterator(4, 18, 0))
  halves = [next(data.train_iterator(4, 18, 0, shard_index=i, shard_count=2)) for i in range(2)]
  assert np.array_equal(np.concatenate([h["inputs"] for h in halves]), whole["inputs"])


@pytest.mark.parametrize("split", ["valid", "test"])
def test_evaluation_scores_every_line_once_and_value_positions_point_at_values(split):
  data = facts.FactsData(SMALL)
  batches = list(data.eval_batches(split, batch_size=5, seq_len=18))  # 15 lines a batch: 5 batches, the last padded
  assert len(batches) == 5
  weights = np.concatenate([b["weights"] for b in batches])
  assert weights.sum() == data.corpus.lines.size  # every line's tokens once (eos predicted first), padding 0
  targets = np.concatenate([b["targets"] for b in batches]).ravel()
  inputs = np.concatenate([b["inputs"] for b in batches]).ravel()
  order, positions = data.value_positions(split, 5, 18)
  assert sorted(order.tolist()) == list(range(data.corpus.num_lines))
  assert np.array_equal(targets[positions], data.corpus.values()[order])
  assert np.array_equal(inputs[positions[:, 0]], data.corpus.lines[order, facts.LINE_PREFIX - 1])
  assert (weights.ravel()[positions] == 1).all()
  assert (split == "valid") == np.array_equal(order, np.arange(data.corpus.num_lines))


def test_token_counts_read_each_line_once():
  data = facts.FactsData(SMALL)
  counts = split_token_counts(data, data.vocab_size)
  assert counts[0] == data.corpus.num_lines and counts.sum() == data.corpus.lines.size


@pytest.mark.parametrize("key, value, message", [
    ("entities", 0, "data.facts.entities=0 must be at least 1"),
    ("entities", 1601, "data.facts.entities=1601 exceeds the 1600 (first, last) name pairs"),
    ("attribute_values", 65, "data.facts.attribute_values=65 exceeds the 64 values"),
    ("layout", "value_first", "data.facts.layout='value_first' is unknown"),
    ("value_tokens", 0, "data.facts.value_tokens=0 must be at least 1"),
])
def test_bad_settings_are_one_error_naming_the_key(key, value, message):
  config = facts_cpu.get_config()
  config.data.facts[key] = value
  with pytest.raises(ConfigError, match=re.escape(message)):
    config_validation.validate_config(config)


@pytest.mark.parametrize("key, value, ok", [("entities", 1600, True), ("attribute_values", 64, True), ("value_tokens", 2, True),
                                            ("value_pieces", 8, False), ("value_pieces", 63, False)])
def test_the_edges_of_the_settings(key, value, ok):
  """1,600 entities (40 x 40) and 64 values (64 pieces) are the preset's maxima; two value tokens make 6-token
  lines, which 60 divides; 63 pieces with one token spell one value too few."""
  config = facts_cpu.get_config()
  config.data.facts[key] = value
  if ok:
    config_validation.validate_config(config)
  else:
    with pytest.raises(ConfigError):
      config_validation.validate_config(config)


def test_a_sequence_length_that_cuts_a_line_is_refused():
  config = facts_cpu.get_config()
  config.train.seq_len = 58
  with pytest.raises(ConfigError, match=re.escape("train.seq_len=58 must be a multiple of a fact line's 5 tokens")):
    config_validation.validate_config(config)

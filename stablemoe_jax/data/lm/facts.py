"""A synthetic fact corpus (``data.corpus=facts``): entities with attributes, each value drawn at random.

Where a small MoE must pay: a corpus holding more facts than a dense model of the MoE's active parameters can
store (Allen-Zhu & Li, "Physics of Language Models 3.3": about 2 bits a parameter after ~1,000 exposures) but
fewer than its total parameters can. Everything is generated from ``data.facts`` (its own ``seed``: the same facts
for every run seed); nothing is downloaded or written.

Vocabulary (ids in this order): ``<eos>``, first-name pieces ``F0..``, last-name pieces ``L0..``, attribute
tokens ``A{a}.{t}`` (attribute a in phrasing t), value pieces ``V0..``. An entity is a (first, last) pair, never a
token of its own, so the embedding table cannot hold its facts. A line renders one fact in one phrasing, L =
``LINE_PREFIX + value_tokens + 1`` tokens, eos last:

    attribute_first:  A{a}.{t} F{f} L{l} V.. V.. <eos>   (the token before the value is a name piece)
    name_first:       F{f} L{l} A{a}.{t} V.. V.. <eos>   (it is the attribute token)

A row of a batch is ``<eos>`` and then n = S / L whole lines (S = the sequence length): inputs = row[:-1],
targets = row[1:], so line m of a row puts its value tokens at target positions ``m * L + LINE_PREFIX + j``.
Training rows draw lines from a fresh permutation of every line each epoch (seeded by the run's seed), so no
line's neighbours predict it; evaluation scores every line once, ``valid`` in fact order, ``test`` in a fixed
shuffled order (the facts are the training facts: this regime measures memorisation, not held-out text).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core.settings import FactsSettings
from stablemoe_jax.data.common.tokenizers import EOS, WordTokenizer
from stablemoe_jax.data.lm.batches import per_process_batch
from stablemoe_jax.data.lm.stream import TokenStream

LAYOUTS = ("attribute_first", "name_first")
LINE_PREFIX = 3  # the tokens before a line's value: attribute, first and last name, in the layout's order
SPLITS = ("train", "valid", "test")
_TEST_ORDER_SEED = 7_919  # folded with the corpus seed: the test split's fixed line order


def check_settings(facts: FactsSettings, seq_lens: dict[str, int]) -> None:
  """ConfigError, one line naming the key, for ``data.facts`` settings that cannot make a corpus, or a sequence
  length (``{"train.seq_len": S, ...}``) that is not a whole number of lines."""
  for key in ("first_names", "last_names", "entities", "attributes", "attribute_values", "value_pieces", "value_tokens",
              "templates"):
    value = getattr(facts, key)
    if value < 1:
      raise ConfigError(f"data.facts.{key}={value} must be at least 1; set --config.data.facts.{key} to a positive "
                        f"number.")
  if facts.layout not in LAYOUTS:
    raise ConfigError(f"data.facts.layout={facts.layout!r} is unknown; choose one of {', '.join(LAYOUTS)}.")
  names = facts.first_names * facts.last_names
  if facts.entities > names:
    raise ConfigError(f"data.facts.entities={facts.entities} exceeds the {names} (first, last) name pairs of "
                      f"data.facts.first_names={facts.first_names} x last_names={facts.last_names}; lower the "
                      f"entities or add name pieces.")
  capacity = facts.value_pieces ** facts.value_tokens
  if facts.attribute_values > capacity:
    raise ConfigError(f"data.facts.attribute_values={facts.attribute_values} exceeds the {capacity} values that "
                      f"value_pieces={facts.value_pieces} ** value_tokens={facts.value_tokens} can spell; lower "
                      f"data.facts.attribute_values or raise data.facts.value_pieces / value_tokens.")
  length = line_length(facts)
  for key, seq_len in seq_lens.items():
    if seq_len % length:
      raise ConfigError(f"{key}={seq_len} must be a multiple of a fact line's {length} tokens (attribute, two name "
                        f"pieces, {facts.value_tokens} value token(s), eos); e.g. --config.{key}="
                        f"{max(1, seq_len // length) * length}.")


def line_length(facts: FactsSettings) -> int:
  return LINE_PREFIX + facts.value_tokens + 1


@dataclasses.dataclass(frozen=True)
class FactsCorpus:
  """The generated corpus.

  tokens: the vocabulary, id i = tokens[i] (``<eos>`` first);
  lines: int32 [N, L], every line (fact x phrasing) in fact order, phrasing fastest; N = entities * attributes *
    templates;
  entity: int32 [N, 2] the (first, last) piece index of each line's entity; attribute: int32 [N];
  value_tokens: the tokens of a value, at columns LINE_PREFIX .. LINE_PREFIX + value_tokens - 1 of a line.
  """

  tokens: tuple[str, ...]
  lines: np.ndarray
  entity: np.ndarray
  attribute: np.ndarray
  value_tokens: int

  @property
  def num_lines(self) -> int:
    return len(self.lines)

  @property
  def line_length(self) -> int:
    return self.lines.shape[1]

  def values(self) -> np.ndarray:
    """int32 [N, value_tokens]: each line's value ids."""
    return self.lines[:, LINE_PREFIX:LINE_PREFIX + self.value_tokens]


def generate(facts: FactsSettings) -> FactsCorpus:
  """The corpus of the ``data.facts`` settings (checked first); the same settings always give the same corpus."""
  check_settings(facts, {})
  rng = np.random.default_rng([facts.seed, 0x66616374])  # 'fact'
  first_id = 1
  last_id = first_id + facts.first_names
  attribute_id = last_id + facts.last_names
  value_id = attribute_id + facts.attributes * facts.templates
  tokens = ((EOS,) + tuple(f"F{i}" for i in range(facts.first_names)) + tuple(f"L{i}" for i in range(facts.last_names))
            + tuple(f"A{a}.{t}" for a in range(facts.attributes) for t in range(facts.templates))
            + tuple(f"V{i}" for i in range(facts.value_pieces)))
  pairs = np.sort(rng.choice(facts.first_names * facts.last_names, size=facts.entities, replace=False))
  entity = np.stack([pairs // facts.last_names, pairs % facts.last_names], axis=1).astype(np.int32)  # [E, 2]
  spellings = _value_spellings(rng, facts)  # [A, values, value_tokens] piece indices
  chosen = rng.integers(facts.attribute_values, size=(facts.entities, facts.attributes))  # [E, A]
  values = spellings[np.arange(facts.attributes)[None, :], chosen] + value_id  # [E, A, value_tokens]
  e, a, t = np.meshgrid(np.arange(facts.entities), np.arange(facts.attributes), np.arange(facts.templates),
                        indexing="ij")
  e, a, t = e.ravel(), a.ravel(), t.ravel()
  attr_tok = attribute_id + a * facts.templates + t
  first_tok, last_tok = first_id + entity[e, 0], last_id + entity[e, 1]
  prefix = ([attr_tok, first_tok, last_tok] if facts.layout == "attribute_first"
            else [first_tok, last_tok, attr_tok])
  lines = np.concatenate([np.stack(prefix, axis=1), values[e, a], np.zeros((len(e), 1), np.int64)], axis=1)
  return FactsCorpus(tokens=tokens, lines=lines.astype(np.int32), entity=entity[e], attribute=a.astype(np.int32),
                     value_tokens=facts.value_tokens)


def _value_spellings(rng: np.random.Generator, facts: FactsSettings) -> np.ndarray:
  """int [attributes, values, value_tokens]: each attribute's ``values`` distinct spellings in value pieces."""
  space = facts.value_pieces ** facts.value_tokens
  out = np.empty((facts.attributes, facts.attribute_values, facts.value_tokens), np.int64)
  for a in range(facts.attributes):
    count = facts.attribute_values
    codes = rng.choice(space, size=count, replace=False) if space <= 1 << 22 else _distinct(rng, space, count)
    for j in range(facts.value_tokens):  # base-value_pieces digits, most significant first
      out[a, :, facts.value_tokens - 1 - j] = (codes // facts.value_pieces ** j) % facts.value_pieces
  return out


def _distinct(rng: np.random.Generator, space: int, count: int) -> np.ndarray:
  seen: dict[int, None] = {}
  while len(seen) < count:
    seen.setdefault(int(rng.integers(space)), None)
  return np.fromiter(seen, np.int64, count)


def split_order(corpus: FactsCorpus, split: str, corpus_seed: int) -> np.ndarray:
  """int64 [N]: the lines of an evaluation split in the order it scores them (valid: fact order; test: fixed
  shuffle)."""
  if split == "test":
    return np.random.default_rng([corpus_seed, _TEST_ORDER_SEED]).permutation(corpus.num_lines)
  if split in ("valid", "train"):
    return np.arange(corpus.num_lines)
  raise ValueError(f"Unknown split {split!r}; available: {', '.join(SPLITS)}.")


def rows_of(lines: np.ndarray, lines_per_row: int, rows: int) -> np.ndarray:
  """int32 [rows, 1 + lines_per_row * L]: ``<eos>`` then ``lines_per_row`` lines per row; missing lines at the
  end are zeros (padding, to be weighted 0)."""
  length = lines.shape[1]
  flat = np.zeros((rows * lines_per_row, length), np.int32)
  flat[:len(lines)] = lines
  body = flat.reshape(rows, lines_per_row * length)
  return np.concatenate([np.zeros((rows, 1), np.int32), body], axis=1)


def batch_of(rows: np.ndarray, real_lines: int | None = None, line_length: int | None = None) -> dict:
  """The batch of token rows [B, S + 1]: inputs, targets, weights [B, S]; with ``real_lines``, target positions
  past the first ``real_lines`` lines (row-major) weigh 0."""
  weights = np.ones(rows[:, 1:].shape, np.float32)
  if real_lines is not None:
    per_row = (rows.shape[1] - 1) // line_length
    line_of = np.arange(rows.shape[0])[:, None] * per_row + np.arange(rows.shape[1] - 1)[None, :] // line_length
    weights = (line_of < real_lines).astype(np.float32)
  return {"inputs": rows[:, :-1], "targets": rows[:, 1:], "weights": weights}


class FactsTrainIterator:
  """Endless training batches [B // shard_count, S]: line slot s of the run is line ``perm_e[s mod N]`` of epoch e =
  s // N's permutation (``default_rng([seed, e])``); batch k holds slots [k B n, (k + 1) B n), n lines a row, and
  process i its rows [i b, (i + 1) b). State ``{"next_index": k}`` (exact resume)."""

  def __init__(self, lines: np.ndarray, batch_size: int, seq_len: int, seed: int, shard_index: int = 0,
               shard_count: int = 1):
    self._lines, self._seed = lines, seed
    self._per_row = seq_len // lines.shape[1]
    self._batch, self._local = batch_size, per_process_batch(batch_size, shard_index, shard_count)
    self._first_row = shard_index * self._local
    self._next = 0
    self._orders: dict[int, np.ndarray] = {}

  def _order(self, epoch: int) -> np.ndarray:
    if epoch not in self._orders:
      if len(self._orders) > 2:
        self._orders.pop(min(self._orders))
      self._orders[epoch] = np.random.default_rng([self._seed, epoch]).permutation(len(self._lines))
    return self._orders[epoch]

  def _slots(self, start: int, count: int) -> np.ndarray:
    n = len(self._lines)
    slots = np.arange(start, start + count)
    epochs = slots // n
    out = np.empty(count, np.int64)
    for epoch in np.unique(epochs):
      where = epochs == epoch
      out[where] = self._order(int(epoch))[slots[where] % n]
    return out

  def __iter__(self) -> "FactsTrainIterator":
    return self

  def __next__(self) -> dict:
    start = (self._next * self._batch + self._first_row) * self._per_row
    chosen = self._lines[self._slots(start, self._local * self._per_row)]
    self._next += 1
    return batch_of(rows_of(chosen, self._per_row, self._local))

  def get_state(self) -> dict:
    return {"next_index": self._next}

  def set_state(self, state: dict) -> None:
    self._next = int(state["next_index"])


class FactsData:
  """``data.corpus=facts`` as the LM task reads a corpus (``batches.LMData``'s interface): the tokenizer, each
  split's stream (its lines once, for token counts), training and evaluation batches; and where each scored line's
  value sits in the evaluation batches (``value_positions``). Built from the ``data.facts`` settings."""

  def __init__(self, facts: FactsSettings):
    self.settings = facts
    self.corpus = generate(self.settings)
    self.tokenizer = WordTokenizer(self.corpus.tokens)
    self.vocab_size = self.tokenizer.vocab_size

  def stream(self, split: str) -> TokenStream:
    return TokenStream(list(self.corpus.lines[split_order(self.corpus, split, self.settings.seed)]))

  def split_num_tokens(self, split: str) -> int:
    split_order(self.corpus, split, self.settings.seed)  # an unknown split: its error
    return self.corpus.lines.size

  def train_iterator(self, batch_size: int, seq_len: int, seed: int, shard_index: int = 0, shard_count: int = 1,
                     read_options=None) -> FactsTrainIterator:
    del read_options  # in memory
    return FactsTrainIterator(self.corpus.lines, batch_size, seq_len, seed, shard_index, shard_count)

  def eval_batches(self, split: str, batch_size: int, seq_len: int, stride: int = 0) -> Iterator[dict]:
    """Every line of ``split`` once, n = S / L lines a row, B rows a batch; the last batch padded (weight 0).
    ``stride`` is ignored: a line's context is its own (each row starts at a line)."""
    del stride
    lines = self.corpus.lines[split_order(self.corpus, split, self.settings.seed)]
    per_row, length = seq_len // self.corpus.line_length, self.corpus.line_length
    per_batch = per_row * batch_size
    for start in range(0, len(lines), per_batch):
      chunk = lines[start:start + per_batch]
      yield batch_of(rows_of(chunk, per_row, batch_size), len(chunk), length)

  def value_positions(self, split: str, batch_size: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(line int64 [N], position int64 [N, value_tokens]) of the evaluation batches of ``split``: line i of the
    split's order is the corpus line ``line[i]``; its value tokens are the targets at flat index ``position[i]`` of
    the concatenated batches' [num_batches * B * S] positions (its first value token's predicting input is at the
    same index)."""
    order = split_order(self.corpus, split, self.settings.seed)
    length = self.corpus.line_length
    per_row = seq_len // length
    i = np.arange(len(order))
    start = (i // per_row) * seq_len + (i % per_row) * length + LINE_PREFIX
    return order, start[:, None] + np.arange(self.corpus.value_tokens)[None, :]

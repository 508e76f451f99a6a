"""``make_rows`` in NumPy (issue 40) against the per-row loop it replaced, kept here as the reference.

On real Multi30k sentences (the shared data folder; words mapped to ids by a fixed table, no tokenizer to train),
read from in-memory sets and from array_record pair shards, through the training iterator's length buckets and
evaluation's padded batches, and on edge cases (empty targets, full-length rows, no pairs, mixed sets).
"""
from __future__ import annotations

import numpy as np
import pytest
from tests.mt_fixtures import multi30k_lines

from stablemoe_jax.core.constants import PAD_ID
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, EOS_ID
from stablemoe_jax.data.translation.pair_records import RecordSet, write_pairs


def _read_pairs(sets_and_indices):
  """(source, target) ids of each (set, index), in order, with one ``pairs`` call per set (a batched read)."""
  by_set = {}
  for row, (encoded, _) in enumerate(sets_and_indices):
    by_set.setdefault(id(encoded), (encoded, []))[1].append(row)
  read = [None] * len(sets_and_indices)
  for encoded, rows in by_set.values():
    for row, pair in zip(rows, encoded.pairs([sets_and_indices[r][1] for r in rows])):
      read[row] = pair
  return read


def loop_make_rows(sets_and_indices, rows: int, max_len: int) -> dict:
  """The implementation before issue 40 (commit 375de8d), verbatim: the pairs read a set at a time, then one row at
  a time."""
  source = np.full((rows, max_len), PAD_ID, np.int32)
  decoder_inputs = np.full((rows, max_len), PAD_ID, np.int32)
  targets = np.full((rows, max_len), PAD_ID, np.int32)
  weights = np.zeros((rows, max_len), np.float32)
  for r, (src, tgt) in enumerate(_read_pairs(sets_and_indices)):
    source[r, :len(src)] = src
    decoder_inputs[r, 0] = BOS_ID
    decoder_inputs[r, 1:len(tgt) + 1] = tgt
    targets[r, :len(tgt)] = tgt
    targets[r, len(tgt)] = EOS_ID
    weights[r, :len(tgt) + 1] = 1.0
  return {"source": source, "decoder_inputs": decoder_inputs, "targets": targets, "weights": weights}


def loop_draw(iterator: batch_lib.MixedPairIterator) -> tuple[list, int]:
  """``MixedPairIterator.draw`` before issue 40 (one ``rng.integers`` call per row); advances ``iterator``."""
  it = iterator
  rng = np.random.default_rng([it._seed, it._batches])
  bucket = 0 if len(it._buckets) == 1 else int(rng.choice(len(it._buckets), p=it._bucket_probs))
  length = it._buckets[bucket]
  rows = it._batch_size * (it._max_len // length)
  pairs = rng.choice(len(it._sets), size=rows, p=it._pair_probs[bucket])
  indices = [it._indices[p][bucket] for p in pairs]
  picks = [(it._sets[p], int(idx[rng.integers(len(idx))])) for p, idx in zip(pairs, indices)]
  it._batches += 1
  return picks[it._shard_index * rows // it._shard_count:(it._shard_index + 1) * rows // it._shard_count], length


def assert_same(got: dict, want: dict) -> None:
  assert sorted(got) == sorted(want)
  for key in want:
    assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def _encode(lines: list[str], table: dict) -> list[list[int]]:
  return [[table.setdefault(w, 4 + len(table) % 3000) for w in line.split()] for line in lines]


def _encoded_set(pair: str, name: str, sources: list[list[int]], targets: list[list[int]], tag: int):
  sources = [[tag] + s + [EOS_ID] for s in sources]
  return batch_lib.EncodedSet(pair, name, *batch_lib._flatten(sources), *batch_lib._flatten(targets))


@pytest.fixture(scope="module")
def multi30k_sets(tmp_path_factory):
  """de-en, fr-en, cs-en: 1,500 real training pairs each, as in-memory sets and as 2-shard record sets."""
  table: dict = {}
  english = _encode(multi30k_lines("train.en", 0, 1500), table)
  in_memory, shards = [], []
  root = tmp_path_factory.mktemp("pair_shards")
  for tag, language in enumerate(("de", "fr", "cs"), start=3000):
    encoded = _encoded_set(f"{language}-en", "train", _encode(multi30k_lines(f"train.{language}", 0, 1500), table),
                           english, tag)
    in_memory.append(encoded)
    pairs = encoded.pairs(range(len(encoded)))
    paths = [root / f"{language}-{k}.array_record" for k in range(2)]
    write_pairs(paths[0], pairs[:700])
    write_pairs(paths[1], pairs[700:])
    shards.append(RecordSet(encoded.pair, "train", paths))
  return in_memory, shards


@pytest.mark.parametrize("reader", ["npz", "shards"])
def test_training_batches_equal_the_loop_on_multi30k(multi30k_sets, reader):
  sets = multi30k_sets[0 if reader == "npz" else 1]
  # configs/mt_paper.py's three buckets at a smaller scale (Multi30k's short sentences fill all three): 64 / 32 /
  # 16 rows of 12 / 24 / 48 positions, this process's half of them.
  make = lambda: batch_lib.MixedPairIterator(sets, 16, 48, seed=3, temperature=5.0, shard_index=1, shard_count=2,
                                            length_buckets=batch_lib.length_buckets(3, 48))
  it, reference = make(), make()
  lengths = set()
  for _ in range(20):
    picks, length = it.draw()
    old_picks, old_length = loop_draw(reference)
    assert length == old_length and [(id(s), i) for s, i in picks.pairs()] == [(id(s), i) for s, i in old_picks]
    lengths.add(length)
    assert_same(batch_lib.make_rows(picks, len(picks), length), loop_make_rows(old_picks, len(old_picks), length))
  assert lengths == {12, 24, 48}
  again = make()
  again.set_state({"batches": 19})
  picks, length = again.draw()
  again.set_state({"batches": 19})
  assert_same(next(again), loop_make_rows(picks.pairs(), len(picks), length))  # __next__ is draw + make_rows


def test_eval_batches_equal_the_loop_on_multi30k(multi30k_sets):
  sets = multi30k_sets[0]
  picks = [(s, int(i)) for s in sets for i in s.fitting(32)]
  batches = list(batch_lib.eval_batches(sets, 100, 32))
  assert len(batches) == -(-len(picks) // 100)
  for k, batch in enumerate(batches):  # the last batch ends in all-padding rows
    assert_same(batch, loop_make_rows(picks[k * 100:(k + 1) * 100], 100, 32))


def test_edge_cases_equal_the_loop():
  a = _encoded_set("de-en", "x", [[5], [], [7] * 6, [8, 9]], [[11, 12], [], [13] * 7, [14]], tag=3)
  b = _encoded_set("fr-en", "x", [[21, 22, 23]], [[24] * 5], tag=4)
  max_len = 8  # a's pair 2: source 8 positions (tag + 6 + eos) and target 7 + eos: both exactly full
  cases = [
      ([], 3),  # no pairs: every row padding
      ([(a, 1)], 1),  # empty source and target: [tag, eos], bos, eos
      ([(a, 2)], 2),  # full-length rows, then a padding row
      ([(a, 0), (b, 0), (a, 3), (b, 0), (a, 2), (a, 0)], 6),  # sets interleaved, pairs repeated
      ([(b, 0), (a, 1)], 5),
  ]
  for picks, rows in cases:
    assert_same(batch_lib.make_rows(picks, rows, max_len), loop_make_rows(picks, rows, max_len))
    assert_same(batch_lib.make_rows(batch_lib.Picks.from_pairs(picks), rows, max_len),
                loop_make_rows(picks, rows, max_len))
  with pytest.raises(ValueError, match="does not fit 7 positions"):
    batch_lib.make_rows([(a, 0), (a, 2)], 2, 7)
  batch = batch_lib.make_rows([(a, 1)], 1, max_len)  # spelled out once
  np.testing.assert_array_equal(batch["source"][0], [3, EOS_ID, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch["decoder_inputs"][0], [BOS_ID, 0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch["targets"][0], [EOS_ID, 0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch["weights"][0], [1, 0, 0, 0, 0, 0, 0, 0])


def test_segments_of_both_readers_agree_with_pairs(multi30k_sets):
  indices = [5, 0, 1499, 700, 699, 5]
  for encoded in (multi30k_sets[0][1], multi30k_sets[1][1]):
    src, src_starts, src_len, tgt, tgt_starts, tgt_len = encoded.segments(indices)
    for k, (s, t) in enumerate(encoded.pairs(indices)):
      np.testing.assert_array_equal(src[src_starts[k]:src_starts[k] + src_len[k]], s)
      np.testing.assert_array_equal(tgt[tgt_starts[k]:tgt_starts[k] + tgt_len[k]], t)

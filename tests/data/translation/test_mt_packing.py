"""Packed translation rows (``data.pack_pairs``): the layout against a per-pair loop, first-fit by hand, the model's
scores of a packed pair against the same pair alone in a row (dense and MoE, loss and gradients), evaluation over
packed batches, the iterator's resume, and the config checks."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.conftest import jit_init
from tests.mt_fixtures import tiny_model_config

from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, EOS_ID
from stablemoe_jax.decoding import bleu_report
from stablemoe_jax.models.seq2seq import TransformerSeq2Seq
from stablemoe_jax.tasks import translation as translation_task
from stablemoe_jax.train.losses import mean_loss, token_nll
from stablemoe_jax.core.settings import ModelSettings, from_config, typed

VOCAB = 40


def _encoded_set(rng: np.random.Generator, n: int, pair: str = "de-en", name: str = "train",
                 longest: int = 14) -> batch_lib.EncodedSet:
  """n pairs of random ids in [4, VOCAB): sources of 2..longest ids (tag and eos stand-ins included), targets of
  0..longest - 2."""
  sources = [list(rng.integers(4, VOCAB, rng.integers(2, longest + 1))) for _ in range(n)]
  targets = [list(rng.integers(4, VOCAB, rng.integers(0, longest - 1))) for _ in range(n)]
  flat = lambda rows: (np.array([i for r in rows for i in r], np.int32),
                       np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64))
  return batch_lib.EncodedSet(pair, name, *flat(sources), *flat(targets))


def loop_placement(picks: batch_lib.Picks, rows: int, max_len: int) -> list[tuple[int, int]]:
  """The reference: (row, segment number) of each pair that first fit places, by a loop over pairs and rows."""
  source_used, target_used, segments = [0] * rows, [0] * rows, [0] * rows
  placed = []
  for encoded, index in picks.pairs():
    s, t = len(encoded.source(index)), len(encoded.target(index)) + 1
    row = next((r for r in range(rows) if source_used[r] + s <= max_len and target_used[r] + t <= max_len), None)
    if row is None:
      break
    source_used[row] += s
    target_used[row] += t
    segments[row] += 1
    placed.append((row, segments[row]))
  return placed


def test_first_fit_by_hand():
  # rows of 10: (6, 3) -> row 0; (5, 2) -> row 1 (row 0 has 4 source positions left); (4, 7) -> row 0 (4 and 7
  # left); (3, 3) -> row 1; (6, 1) fits neither (row 0: 0 left, row 1: 2 left) -> stop; (1, 1) is never placed.
  rows, source_offsets, target_offsets = batch_lib.first_fit(np.array([6, 5, 4, 3, 6, 1]),
                                                             np.array([3, 2, 7, 3, 1, 1]), rows=2, max_len=10)
  np.testing.assert_array_equal(rows, [0, 1, 0, 1])
  np.testing.assert_array_equal(source_offsets, [0, 0, 6, 5])
  np.testing.assert_array_equal(target_offsets, [0, 0, 3, 2])
  # The target side alone can be what stops a pair: row 0's 10 target positions are full after (1, 10).
  rows, _, _ = batch_lib.first_fit(np.array([1, 1]), np.array([10, 1]), rows=1, max_len=10)
  assert list(rows) == [0]


def test_pack_rows_lays_out_every_pair_as_alone():
  rng = np.random.default_rng(0)
  sets = [_encoded_set(rng, 50), _encoded_set(rng, 50, pair="fr-en")]
  picks = batch_lib.Picks.from_pairs([(sets[i % 2], int(j)) for i, j in enumerate(rng.integers(0, 50, 60))])
  rows, length = 6, 32
  batch, used = batch_lib.pack_rows(picks, rows, length)
  assert 0 < used < len(picks)  # 60 pairs of ~9 positions do not fit 6 rows of 32
  placement = loop_placement(picks, rows, length)
  assert len(placement) == used
  assert any(r < max(row for row, _ in placement[:i]) for i, (r, _) in enumerate(placement) if i)  # rows revisited
  for (encoded, index), (r, k) in zip(picks.pairs(), placement):  # each pair's segment is its make_rows row
    alone = batch_lib.make_rows([(encoded, index)], 1, length)
    src = batch["source_segments"][r] == k
    tgt = batch["target_segments"][r] == k
    source, target = encoded.source(index), encoded.target(index)
    np.testing.assert_array_equal(batch["source"][r][src], source)
    np.testing.assert_array_equal(batch["source_positions"][r][src], np.arange(len(source)))
    np.testing.assert_array_equal(batch["decoder_inputs"][r][tgt], [BOS_ID, *target])
    np.testing.assert_array_equal(batch["targets"][r][tgt], [*target, EOS_ID])
    np.testing.assert_array_equal(batch["target_positions"][r][tgt], np.arange(len(target) + 1))
    np.testing.assert_array_equal(batch["targets"][r][tgt], alone["targets"][0][alone["weights"][0] > 0])
    assert np.ptp(np.flatnonzero(src)) == len(source) - 1 and np.ptp(np.flatnonzero(tgt)) == len(target)
  assert sum(int(m) for m in batch["source_segments"].max(axis=1)) == used
  np.testing.assert_array_equal(batch["weights"] > 0, batch["target_segments"] > 0)
  assert batch["weights"].sum() == sum(len(picks.sets[s].target(i)) + 1
                                       for s, i in zip(picks.set_numbers[:used], picks.indices[:used]))
  # Padding: id 0, segment 0, weight 0.
  pad = batch["source_segments"] == 0
  assert (batch["source"][pad] == 0).all() and (batch["targets"][batch["target_segments"] == 0] == 0).all()


def test_pack_rows_reads_prepared_shards_as_in_memory_sets(tmp_path):
  # The same pairs as an in-memory set and as two array_record shards: the same packed batch (lengths from the
  # shards' length arrays, records read only for the pairs placed).
  from stablemoe_jax.data.translation.pair_records import RecordSet, write_pairs
  encoded = _encoded_set(np.random.default_rng(5), 80)
  pairs = encoded.pairs(range(len(encoded)))
  paths = [tmp_path / "a.array_record", tmp_path / "b.array_record"]
  write_pairs(paths[0], pairs[:50])
  write_pairs(paths[1], pairs[50:])
  shards = RecordSet("de-en", "train", paths)
  indices = np.random.default_rng(6).integers(0, 80, 90)
  memory, used = batch_lib.pack_rows(batch_lib.Picks.from_pairs([(encoded, int(i)) for i in indices]), 5, 32)
  read, used_read = batch_lib.pack_rows(batch_lib.Picks.from_pairs([(shards, int(i)) for i in indices]), 5, 32)
  assert used == used_read < 90
  for name in memory:
    np.testing.assert_array_equal(read[name], memory[name], err_msg=name)


def test_pack_rows_rejects_a_target_of_max_len():
  encoded = batch_lib.EncodedSet("de-en", "train", np.arange(4, 7, dtype=np.int32), np.array([0, 3]),
                                 np.arange(4, 12, dtype=np.int32), np.array([0, 8]))
  batch_lib.pack_rows(batch_lib.Picks.from_pairs([(encoded, 0)]), 1, 9)  # 8 ids + eos fit 9
  with pytest.raises(ValueError, match="does not fit 8 positions"):
    batch_lib.pack_rows(batch_lib.Picks.from_pairs([(encoded, 0)]), 1, 8)


def _scores(model, params, batch):
  """Per-position NLL [B, St] and the label-smoothed mean loss of ``batch`` (no dropout, inference routing)."""
  keywords = {k: batch[k] for k in batch_lib.PACKING_KEYS if k in batch}
  logits = model.apply({"params": params}, batch["source"], batch["decoder_inputs"], jnp.array(False),
                       deterministic=True, **keywords).logits()
  return token_nll(logits, batch["targets"]), mean_loss(logits, batch["targets"], batch["weights"], 0.1)


@pytest.mark.parametrize("moe", [False, True])
def test_a_packed_pair_scores_as_alone(moe):
  config = tiny_model_config(VOCAB).model
  config.moe.enabled = moe
  model = TransformerSeq2Seq(typed(ModelSettings, config))
  rng = np.random.default_rng(1)
  sets = [_encoded_set(rng, 40)]
  picks = batch_lib.Picks.from_pairs([(sets[0], int(j)) for j in rng.integers(0, 40, 30)])
  packed, used = batch_lib.pack_rows(picks, 4, 32)
  alone = batch_lib.make_rows(picks[:used], used, 32)
  params = jit_init(model, 0, jnp.zeros((1, 32), jnp.int32), jnp.zeros((1, 32), jnp.int32), jnp.array(True))["params"]

  def both(p):  # one program: each layout's NLLs, loss and gradients
    out = []
    for batch in (packed, alone):
      (loss, nll), grads = jax.value_and_grad(lambda q: _scores(model, q, batch)[::-1], has_aux=True)(p)
      out.append((nll, loss, grads))
    return out
  (packed_nll, packed_loss, packed_grads), (alone_nll, alone_loss, alone_grads) = jax.jit(both)(params)
  # Pair i's target NLLs, packed against alone (the MoE's inference routing drops nothing).
  for i, (r, k) in enumerate(loop_placement(picks, 4, 32)):
    np.testing.assert_allclose(np.asarray(packed_nll)[r][packed["target_segments"][r] == k],
                               np.asarray(alone_nll)[i][alone["weights"][i] > 0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(packed_loss, alone_loss, rtol=1e-6)

  for (path, g), h in zip(jax.tree_util.tree_leaves_with_path(packed_grads), jax.tree.leaves(alone_grads)):
    np.testing.assert_allclose(g, h, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_packed_eval_batches_score_every_pair_once():
  rng = np.random.default_rng(2)
  sets = [_encoded_set(rng, 37), _encoded_set(rng, 23, pair="fr-en", name="valid")]
  plain = list(batch_lib.eval_batches(sets, 8, 16))
  packed = list(batch_lib.eval_batches(sets, 8, 16, pack=True))
  assert len(packed) < len(plain)
  fitting = sum(len(s.fitting(16)) for s in sets)
  assert sum(int(b["source_segments"].max(axis=1).sum()) for b in packed) == fitting
  assert sum(b["weights"].sum() for b in packed) == sum(b["weights"].sum() for b in plain)
  assert sorted(np.concatenate([b["targets"][b["weights"] > 0] for b in packed]).tolist()) == sorted(
      np.concatenate([b["targets"][b["weights"] > 0] for b in plain]).tolist())
  assert list(batch_lib.eval_batches(sets, 8, 16, max_sentences=0, pack=True))[0]["source"].shape == (8, 16)
  assert list(batch_lib.eval_batches([], 8, 16, pack=True)) == []


def test_packed_iterator_resumes_and_shards_exactly():
  rng = np.random.default_rng(3)
  sets = [_encoded_set(rng, 60), _encoded_set(rng, 60, pair="fr-en")]
  make = lambda **kw: batch_lib.MixedPairIterator(sets, 8, 32, seed=5, temperature=1.0, pack=True, **kw)
  whole = make()
  batches = [next(whole) for _ in range(4)]
  resumed = make()
  resumed.set_state({"batches": 2})
  third = next(resumed)
  for name in batches[2]:
    np.testing.assert_array_equal(third[name], batches[2][name])
  halves = [make(shard_index=i, shard_count=2) for i in range(2)]
  for batch in batches:
    parts = [next(h) for h in halves]
    for name in batch:
      np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), batch[name])
  assert all(b["source"].shape == (8, 32) for b in batches)
  with pytest.raises(ValueError, match="length_buckets=1"):
    batch_lib.MixedPairIterator(sets, 8, 32, 0, 1.0, length_buckets=(16, 32), pack=True)


def test_config_checks():
  config = tiny_model_config(VOCAB)
  config.data.pack_pairs, config.data.length_buckets = True, 2
  with pytest.raises(ConfigError, match="data.pack_pairs=True .* set --config.data.length_buckets=1"):
    translation_task.check_config(from_config(config))
  config.data.length_buckets = 1
  translation_task.check_config(from_config(config))
  config.decode.sets = "some"
  with pytest.raises(ConfigError, match="decode.sets='some' is unknown"):
    translation_task.check_config(from_config(config))
  task = translation_task.TranslationTask(from_config(config))
  assert set(task.batch_shapes(4, 32)) == {"source", "decoder_inputs", "targets", "weights",
                                           *batch_lib.PACKING_KEYS}
  assert task.model_keywords({"source": 0}) == {}


@pytest.mark.parametrize("pack, buckets", [(False, 1), (False, 2), (True, 1)])
def test_length_buckets_are_refused_only_with_packed_rows(pack, buckets):
  config = tiny_model_config(VOCAB)
  config.data.pack_pairs, config.data.length_buckets = pack, buckets
  translation_task.check_config(from_config(config))


def test_a_pack_pairs_of_another_type_is_one_error_naming_the_key():
  import ml_collections
  tree = tiny_model_config(VOCAB).to_dict()
  tree["data"]["pack_pairs"] = 1  # a ConfigDict keeps a key's type once set: the value goes in as a dict's
  with pytest.raises(ConfigError, match=r"^data.pack_pairs=1 must be a bool \(the default False\)"):
    translation_task.check_config(from_config(ml_collections.ConfigDict(tree)))  # typed where a run starts


def test_primary_set_names():
  rng = np.random.default_rng(4)
  sets = [_encoded_set(rng, 2, "de-en", n) for n in ("test_2017_flickr", "test_2016_flickr")]
  sets += [_encoded_set(rng, 2, "es-en", "bible_test"), _encoded_set(rng, 2, "xx-en", "news_2020"),
           _encoded_set(rng, 2, "xx-en", "news_2021"), _encoded_set(rng, 2, "cs-en", "valid")]
  assert bleu_report.primary_set_names(sets) == {"de-en": "test_2016_flickr", "es-en": "bible_test",
                                                 "xx-en": "news_2020", "cs-en": "valid"}


def test_a_checkpoint_config_written_before_pack_pairs_restores_with_it_off():
  from configs import mt_cpu
  from stablemoe_jax.train import checkpoint
  current = mt_cpu.get_config().to_dict()
  old = mt_cpu.get_config().to_dict()
  del old["data"]["pack_pairs"]
  compare = lambda a, b: checkpoint._differences(checkpoint._comparable(a, True), checkpoint._comparable(b, True))
  assert compare(old, current) == []
  current["data"]["pack_pairs"] = True
  assert compare(old, current) == ["data.pack_pairs: checkpoint '<absent>', this config True"]

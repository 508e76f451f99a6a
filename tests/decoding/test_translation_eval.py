"""BLEU's fixed points, and translating lines: one output line per input line, in order, empty lines kept."""
from __future__ import annotations

import numpy as np
import pytest

from stablemoe_jax.commands.translate import read_lines
from stablemoe_jax.core.errors import DataError
from stablemoe_jax.data.translation.joint_tokenizer import BOS_ID, EOS_ID, JointSentencePiece
from stablemoe_jax.decoding import bleu
from stablemoe_jax.decoding.translate_lines import translate_lines
from stablemoe_jax.models.seq2seq import PAD_ID

REFERENCES = ["A man in an orange hat starring at something.", "Two dogs are playing in the snow together.",
              "A group of people standing in front of an igloo.", "A little girl climbing into a wooden playhouse."]


def test_bleu_of_the_references_is_100_and_of_empty_output_0():
  score, signature = bleu.corpus_bleu(REFERENCES, REFERENCES)
  assert score == pytest.approx(100.0)
  assert signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.")
  assert bleu.corpus_bleu([""] * len(REFERENCES), REFERENCES)[0] == 0.0
  assert bleu.corpus_bleu([r.lower() for r in REFERENCES], REFERENCES)[0] < 100.0  # cased


@pytest.fixture(scope="module")
def tokenizer():
  lines = [f"{r} {i}" for i in range(30) for r in REFERENCES]
  return JointSentencePiece.train(lines, vocab_size=60, languages=["de"])


def test_decoding_drops_special_ids_and_tags(tokenizer):
  ids = tokenizer.encode("Two dogs are playing.")
  assert tokenizer.decode([tokenizer.tag_id("de"), BOS_ID, *ids, EOS_ID, PAD_ID]) == "Two dogs are playing."


def _echo(params, batch):
  """A stand-in translator: the source without its tag (ids, eos, pad): each line translates to itself."""
  del params
  return np.concatenate([batch[:, 1:], np.zeros_like(batch[:, :1])], axis=1), None


def test_translated_lines_keep_count_order_and_empty_lines(tokenizer):
  lines = ["Two dogs are playing in the snow together.", "", "A man.", "   ",
           "A group of people standing in front of an igloo.", "A man in an orange hat starring at something."]
  out = translate_lines(_echo, None, tokenizer, "de", lines, batch_size=2, max_len=64)
  assert out.lines == [line.strip() for line in lines]
  assert out.truncated == 0


def test_batches_are_sorted_by_length_and_padded_to_their_length_bucket(tokenizer):
  lines = REFERENCES + ["A man.", "Two dogs are playing.", "A group of people standing in front of a wooden igloo."]
  batches = []

  def recording_echo(params, batch):
    batches.append(batch.copy())
    return _echo(params, batch)

  out = translate_lines(recording_echo, None, tokenizer, "de", lines, batch_size=2, max_len=64, length_bucket=4)
  assert out.lines == lines  # in the input order
  lengths = sorted(len(tokenizer.encode(line)) + 2 for line in lines)  # tag + ids + eos
  assert [int(n) for b in batches for n in np.sum(b != PAD_ID, axis=1) if n] == lengths  # sorted, shortest first
  assert all(b.shape == (2, -(-np.max(np.sum(b != PAD_ID, axis=1)) // 4) * 4) for b in batches)
  assert len(batches) == 4 and not batches[-1][1].any()  # 7 lines: the last batch has an empty row


def test_over_long_sources_are_truncated_and_counted(tokenizer):
  out = translate_lines(_echo, None, tokenizer, "de", REFERENCES, batch_size=4, max_len=6)
  assert out.truncated == len(REFERENCES)
  assert len(out.lines) == len(REFERENCES) and all(out.lines)


def test_input_lines_and_invalid_utf8(tmp_path):
  good = tmp_path / "in.txt"
  good.write_bytes(b"eins\r\n\nzwei\ndrei")
  assert read_lines(str(good)) == ["eins", "", "zwei", "drei"]
  (tmp_path / "empty.txt").write_bytes(b"")
  assert read_lines(str(tmp_path / "empty.txt")) == []
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"ok\nnot \xff utf-8\n")
  with pytest.raises(DataError, match=r"bad.txt, line 2"):
    read_lines(str(bad))

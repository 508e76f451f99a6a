"""The tokenizers on the real corpora: PTB's word vocabulary, round trips, save and reload, SentencePiece."""
from __future__ import annotations

import pytest

from stablemoe_jax.data.common import text
from stablemoe_jax.data.common import tokenizers


# --- tokenizers ---------------------------------------------------------------


def test_ptb_word_vocabulary_is_the_standard_10k(ptb, ptb_files):
  tok = ptb.tokenizer
  assert isinstance(tok, tokenizers.WordTokenizer)
  assert tok.vocab_size == ptb.vocab_size == 10000
  assert tok.eos_id == 0 and tok.id_to_token(0) == '<eos>'
  assert tok.id_to_token(1) == 'the'  # Most frequent train word.
  unk = tok.token_to_id('<unk>')
  assert tok.encode('the zyzzyva-never-seen') == [1, unk]
  # Valid and test have no word outside the train vocabulary.
  for split in ('valid', 'test'):
    words = {w for line in text.iter_lines(ptb_files[split]) for w in line.split()}
    assert all(tok.token_to_id(w) >= 0 for w in words)


def test_word_vocabulary_order_is_deterministic():
  tok = tokenizers.WordTokenizer.from_lines(['b a c a', 'c b a d'])
  assert [tok.id_to_token(i) for i in range(tok.vocab_size)] == ['<eos>', 'a', 'b', 'c', 'd']
  with pytest.raises(ValueError, match='not in the vocabulary'):
    tok.encode('a e')  # No <unk> in this vocabulary.


def test_word_round_trip_of_a_real_line(ptb, ptb_files):
  line = next(text.iter_lines(ptb_files['valid']))
  ids = ptb.tokenizer.encode(line)
  assert ptb.tokenizer.eos_id not in ids
  assert ptb.tokenizer.decode(ids) == ' '.join(line.split())


def test_word_tokenizer_saves_and_reloads(ptb, prepared_dir, ptb_files):
  again = tokenizers.build_tokenizer('word', ptb_files['train'], prepared_dir / 'tokenizer')
  assert again.fingerprint() == ptb.tokenizer.fingerprint()
  loaded = tokenizers.load_tokenizer(prepared_dir / 'tokenizer')
  assert loaded.fingerprint() == ptb.tokenizer.fingerprint()
  vocab = (prepared_dir / 'tokenizer' / 'vocab.txt').read_text().splitlines()
  assert len(vocab) == 10000 and vocab[0] == '<eos>'
  with pytest.raises(ValueError, match='built differently'):
    tokenizers.build_tokenizer('sentencepiece', ptb_files['train'], prepared_dir / 'tokenizer', 500)


def test_sentencepiece_trains_deterministically_and_round_trips(shared_data, tmp_path):
  botchan = shared_data / 'botchan' / 'botchan.txt'
  a = tokenizers.build_tokenizer('sentencepiece', botchan, tmp_path / 'a', vocab_size=500)
  b = tokenizers.SentencePieceTokenizer.from_file(botchan, 500)
  assert a.fingerprint() == b.fingerprint()  # Same model bytes.
  assert a.vocab_size == 500 and a.id_to_token(a.eos_id) == '</s>'
  lines = list(text.iter_lines(botchan))
  assert not any('\r' in line or '\ufeff' in line for line in lines)
  for line in lines:
    ids = a.encode(line)
    assert a.eos_id not in ids
    assert a.decode(ids) == ' '.join(line.split())
  # Reloaded from disk: same model; a different vocab size is refused.
  reloaded = tokenizers.build_tokenizer('sentencepiece', botchan, tmp_path / 'a', vocab_size=500)
  assert reloaded.fingerprint() == a.fingerprint()
  with pytest.raises(ValueError, match='built differently'):
    tokenizers.build_tokenizer('sentencepiece', botchan, tmp_path / 'a', vocab_size=600)

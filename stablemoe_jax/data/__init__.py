"""Corpora, tokenizers and grain input pipelines for language modeling.

Data flows one way:

    locate (raw text files) -> tokenizers (train split only)
      -> builder (TFDS array_record: one int32 record per line, ids + eos)
      -> stream (a split as one token stream, via cumulative offsets)
      -> blocks (train blocks / eval rows) -> pipeline (grain batches)

Entry point: `load_lm_data(config.data, workdir / 'data')` returns `LMData`,
whose `train_iterator(batch_size, seq_len, seed)` and
`eval_batches(split, batch_size, seq_len)` yield dicts of numpy arrays
`inputs` int32 [B, S], `targets` int32 [B, S], `weights` float32 [B, S].
Nothing downloads implicitly; see `stablemoe_jax.data.download` for PTB.
Without the raw corpus, `load_lm_data` reads the tokenizer and records
already prepared in that directory if they match the config (`prepared`), so
evaluating or resuming a run needs only its workdir.
"""

from stablemoe_jax.data.locate import DataError, DataNotFoundError, corpus_files, resolve_data_dir
from stablemoe_jax.data.pipeline import LMData, eval_batches, load_lm_data, train_iterator
from stablemoe_jax.data.tokenizers import (
    SentencePieceTokenizer,
    Tokenizer,
    WordTokenizer,
    build_tokenizer,
    load_tokenizer,
)

__all__ = [
    'DataError',
    'DataNotFoundError',
    'LMData',
    'SentencePieceTokenizer',
    'Tokenizer',
    'WordTokenizer',
    'build_tokenizer',
    'corpus_files',
    'eval_batches',
    'load_lm_data',
    'load_tokenizer',
    'resolve_data_dir',
    'train_iterator',
]

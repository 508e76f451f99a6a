"""The LM input pipeline: config -> tokenizer -> TFDS records -> grain batches.

Every batch is a dict of numpy arrays, B = batch size, S = sequence length:

    inputs  int32   [B, S]
    targets int32   [B, S]   (next token of each input)
    weights float32 [B, S]   (1 = counts in the loss; all ones in training)

Training (`train_iterator`), fairseq `sample_break_mode=none`: a split is one
stream (each line's ids + eos, concatenated); it is cut into (N - 1) // S
blocks of S + 1 tokens overlapping by one (`blocks.TrainBlocks`). grain
shuffles the blocks with a fresh permutation every epoch and repeats forever:

    MapDataset.source(blocks).seed(seed).shuffle().repeat(None)
        .batch(B // shard_count)[shard_index::shard_count].to_iter_dataset()

grain's `shuffle` draws epoch e's permutation with seed (derived seed + e), so
placing it before `repeat` reshuffles each epoch; consecutive epochs join
without a gap, so a batch may straddle two epochs. The iterator's state is
`{'next_index': k}` (k = batches returned so far): `get_state()` after k
batches and `set_state()` on a fresh iterator resumes exactly.

Multi-host: with `shard_count` processes, process `shard_index` gets rows
[shard_index * b, (shard_index + 1) * b) of every global batch, b =
batch_size // shard_count; the processes' batches concatenated in shard order
are exactly the single-process global batch. Every process must use the same
seed.

Evaluation (`eval_batches`): inputs = stream[:-1], targets = stream[1:], tiled
in order by non-overlapping rows of S, B rows per batch; the last batch is
padded (id 0, weight 0) to full [B, S], so sum(weights) over all batches ==
len(stream) - 1. Deterministic.
"""

from __future__ import annotations

import pathlib

from stablemoe_jax.core.settings import LMDataSettings
from stablemoe_jax.data.common import locate
from stablemoe_jax.data.common import text
from stablemoe_jax.data.common import tokenizers
from stablemoe_jax.data.lm import builder as builder_lib
from stablemoe_jax.data.lm import facts
from stablemoe_jax.data.lm import grain_reader
from stablemoe_jax.data.lm import prepared
from stablemoe_jax.data.lm.batches import (  # noqa: F401  (re-exported)
    DEFAULT_READ_OPTIONS, Batch, LMData, eval_batches, train_dataset, train_iterator)
from stablemoe_jax.data.lm.stream import FieldSource


def load_lm_data(data: LMDataSettings, prepared_dir: pathlib.Path) -> LMData | facts.FactsData:
  """Resolves the corpus, builds (or reuses) the tokenizer and the records, returns LMData.

  Without the raw corpus (no data directory, or one without the files), the
  tokenizer and records already prepared in `prepared_dir` are used if they
  were prepared for this data config (see `prepared`), so evaluating or
  resuming a run needs only its workdir.

  Args:
    data: the run's data settings (`RunSettings.data`): `corpus` ('ptb' | 'text' |
      'files' | 'facts'), `data_dir` ('' = $STABLEMOE_DATA_DIR), `tokenizer`
      ('word' | 'sentencepiece'), `sentencepiece_vocab_size`, ...
    prepared_dir: the run's prepared-data directory (e.g. workdir/data). If
      `python -m stablemoe_jax.prepare` wrote shards there, those are
      used (`grain_reader.load`); otherwise it gets
      `tokenizer/`, `tfds/` and `prepared.json`. Reused on later calls (a resumed run).
      With several processes sharing one directory, let process 0 call this
      first (then a barrier), so only one process writes.

  Raises:
    ValueError: unknown corpus or tokenizer value.
    DataNotFoundError: the corpus files are missing and nothing is prepared
      (message says how to fix).
    BadCorpusError: a corpus file is not UTF-8 or a split has no text
      (checked before anything is written).
    PreparedDataMismatchError: no raw corpus, and the prepared data was built
      for another data config.
  """
  prepared_dir = pathlib.Path(prepared_dir)
  if data.corpus == 'facts':  # generated in memory from data.facts: nothing to read or prepare
    return facts.FactsData(data.facts)
  if prepared.is_sharded(prepared_dir):  # Written by `python -m stablemoe_jax.prepare`: use them.
    return grain_reader.load(prepared_dir, data)
  corpus, kind = data.corpus, data.tokenizer
  if corpus == 'files':
    raise locate.DataNotFoundError(
        f'data.corpus=files is prepared by `python -m stablemoe_jax.prepare --config CONFIG --workdir DIR` '
        f'first; {prepared_dir} holds no prepared shards.')
  if corpus not in locate.CORPORA:
    raise ValueError(f'Unknown data.corpus {corpus!r}; allowed: {", ".join(locate.CORPORA)}.')
  if kind not in tokenizers.TOKENIZER_KINDS:
    raise ValueError(
        f'Unknown data.tokenizer {kind!r}; allowed: {", ".join(tokenizers.TOKENIZER_KINDS)}.'
    )
  try:
    data_dir = locate.resolve_data_dir(data.data_dir, corpus)
  except locate.DataNotFoundError:
    if not prepared.has_manifest(prepared_dir):
      raise
    tokenizer, sources, records_dir = prepared.load(prepared_dir, data)
    return LMData(tokenizer=tokenizer, vocab_size=tokenizer.vocab_size, sources=sources,
                  stream_cache_dir=records_dir)
  files = locate.corpus_files(data_dir, corpus)
  for split, path in files.items():
    text.check_corpus_file(path, split)
  tokenizer = tokenizers.build_tokenizer(
      kind, files['train'], prepared_dir / 'tokenizer', vocab_size=data.sentencepiece_vocab_size)
  builder = builder_lib.LmCorpus(
      split_files=files, tokenizer=tokenizer, corpus=corpus, data_dir=prepared_dir / 'tfds'
  )
  builder.prepare()
  prepared.write_manifest(prepared_dir, data, tokenizer, pathlib.Path(str(builder.data_dir)), list(files))
  sources = {
      split: FieldSource(builder.as_data_source(split=split), 'tokens') for split in files
  }
  return LMData(tokenizer=tokenizer, vocab_size=tokenizer.vocab_size, sources=sources,
                stream_cache_dir=pathlib.Path(str(builder.data_dir)))

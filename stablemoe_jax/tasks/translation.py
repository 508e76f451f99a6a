"""X->English translation: an encoder-decoder over mixed language pairs, label-smoothed training loss.

Batches: ``source``, ``decoder_inputs``, ``targets`` int32 [B, L] and ``weights`` float32 [B, L]
(``data/translation/pipeline.py``). Evaluation's loss is the plain (unsmoothed) NLL of the targets, teacher-forced.
"""
from __future__ import annotations

import itertools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.constants import PAD_ID
from stablemoe_jax.core.errors import require, require_parses
from stablemoe_jax.data.translation import batches as batch_lib
from stablemoe_jax.data.translation import files as parallel_files
from stablemoe_jax.data.translation import pipeline as data_lib
from stablemoe_jax.data.translation import wmt
from stablemoe_jax.decoding import bleu_report as bleu_lib
from stablemoe_jax.decoding.bleu_report import bleu_report
from stablemoe_jax.models.seq2seq import TransformerSeq2Seq
from stablemoe_jax.train.losses import head_mean_loss, head_token_nll
from stablemoe_jax.train.schedules import SCHEDULES


def check_config(run: settings_lib.RunSettings) -> None:
  """The typed config's sections as translation reads them, beyond the shared checks (``config_validation``)."""
  train, moe, data = run.train, run.model.moe, run.data
  corpus = data.corpus
  require(corpus in ("multi30k_bible", "wmt", "files"),
          f"data.corpus={corpus!r} is unknown; choose multi30k_bible, wmt or files.")
  if corpus == "files":  # a user's own parallel files (configs/mt_files.py)
    require_parses(parallel_files.check_config, data)
  if corpus == "wmt":
    require_parses(wmt.parse_wmt_pairs, data.pairs)
  require(data.sampling_temperature > 0,
          f"data.sampling_temperature={data.sampling_temperature} must be > 0 (1: proportional).")
  require_parses(batch_lib.length_buckets, data.length_buckets, train.seq_len)
  require(not data.pack_pairs or data.length_buckets == 1,
          f"data.pack_pairs=True packs pairs into rows of train.seq_len, so it takes no length buckets; set "
          f"--config.data.length_buckets=1 (it is {data.length_buckets}).")
  require(0.0 <= train.label_smoothing < 1.0, f"train.label_smoothing={train.label_smoothing} must lie in [0, 1).")
  require(run.eval.max_sentences >= 0,
          f"eval.max_sentences={run.eval.max_sentences} must be >= 0 (0: every sentence).")
  decode = run.decode  # a config without the section reads its defaults, which pass
  require(decode.beam_size >= 1, f"decode.beam_size={decode.beam_size} must be >= 1 (1: greedy search).")
  require(0 <= decode.max_len <= run.model.max_len,
          f"decode.max_len={decode.max_len} must lie in [0, model.max_len={run.model.max_len}] (0: model.max_len).")
  require(decode.batch_size > 0, f"decode.batch_size={decode.batch_size} must be positive.")
  require(decode.length_penalty >= 0, f"decode.length_penalty={decode.length_penalty} must be >= 0.")
  require(decode.sets in bleu_lib.DECODE_SETS,
          f"decode.sets={decode.sets!r} is unknown; choose one of {bleu_lib.DECODE_SETS}.")
  require(train.schedule in SCHEDULES, f"train.schedule={train.schedule!r} is unknown; choose one of {SCHEDULES}.")
  # A decode step sees one position; only a router of the token id alone routes it as the whole sequence did.
  require(moe.distilled_router.kind == "embedding",
          f"model.moe.distilled_router.kind={moe.distilled_router.kind!r}: translation decodes one position at "
          f"a time, so its distilled router must be 'embedding' (the token id alone).")


class TranslationTask:
  """``config.task = "translation"``; reads ``train.label_smoothing`` and ``data.pack_pairs`` from the settings it
  is built with (the run's, typed), ``data.sampling_temperature``, ``data.length_buckets`` and
  ``eval.max_sentences`` from those its methods are given."""

  name = "translation"

  def __init__(self, settings: settings_lib.RunSettings):
    self._label_smoothing = float(settings.train.label_smoothing)
    self._pack = settings.data.pack_pairs

  def load_data(self, data: settings_lib.TranslationDataSettings, prepared_dir):
    corpus = data.corpus
    # A user's files and WMT go through `prepare` (pair shards); Multi30k and the Bible are encoded here if not.
    if corpus in ("files", "wmt") and not (pathlib.Path(prepared_dir) / "translation" / data_lib.MANIFEST).is_file():
      if corpus == "wmt":
        wmt.require_prepared(data)
      raise data_lib.DataNotFoundError(
          f"data.corpus={corpus!r}: nothing prepared in {prepared_dir}; first run `python -m "
          f"stablemoe_jax.prepare --config CONFIG --workdir WORKDIR` with this config and workdir.")
    return data_lib.load_translation_data(data, pathlib.Path(prepared_dir))

  def build_model(self, model: settings_lib.ModelSettings):
    return TransformerSeq2Seq(model)

  def sample_inputs(self, settings):
    rows = jnp.zeros((1, settings.train.seq_len), jnp.int32)
    return rows, rows

  def batch_shapes(self, rows, seq_len):
    shape = (rows, seq_len)
    names = ("source", "decoder_inputs", "targets") + (batch_lib.PACKING_KEYS if self._pack else ())
    ids = {name: jax.ShapeDtypeStruct(shape, jnp.int32) for name in names}
    return {**ids, "weights": jax.ShapeDtypeStruct(shape, jnp.float32)}

  def model_inputs(self, batch):
    return batch["source"], batch["decoder_inputs"]

  def model_keywords(self, batch):
    """Packed rows' segments and positions (``batch_lib.PACKING_KEYS``); {} for one pair a row."""
    return {name: batch[name] for name in batch_lib.PACKING_KEYS if name in batch}

  def train_loss(self, output, batch) -> jax.Array:
    return head_mean_loss(output, batch["targets"], batch["weights"], self._label_smoothing)

  def eval_sums(self, output, batch):
    weights = batch["weights"]
    return {"nll_sum": jnp.sum(head_token_nll(output, batch["targets"]) * weights), "tokens": weights.sum()}

  def train_iterator(self, data, settings, shard_index: int, shard_count: int):
    train, data_settings = settings.train, settings.data
    buckets = batch_lib.length_buckets(data_settings.length_buckets, train.seq_len)
    return batch_lib.MixedPairIterator(data.split_sets("train"), train.batch_size, train.seq_len, settings.seed,
                                       data_settings.sampling_temperature, shard_index, shard_count, buckets,
                                       pack=data_settings.pack_pairs)

  def eval_batches(self, data, settings, split: str, stride: int = 0):
    del stride  # sentences are scored whole
    return batch_lib.eval_batches(data.split_sets(split), settings.eval.batch_size, settings.eval.seq_len,
                                  settings.eval.max_sentences, pack=self._pack)

  def routing_sample(self, data, settings, rows: int):
    """The first validation pairs that fit ``train.seq_len``, taken in turn from each pair's set (so every pair
    is in the sample); fewer fitting pairs than ``rows`` leave padding rows, which no report counts."""
    fitting = [[(s, int(i)) for i in s.fitting(settings.train.seq_len)] for s in data.split_sets("valid")]
    picks = [p for group in itertools.zip_longest(*fitting) for p in group if p is not None][:rows]
    return batch_lib.make_rows(picks, rows, settings.train.seq_len)

  def routing_tokens(self, layer, batch):
    """Encoder layers route the source, decoder layers the decoder inputs (bos + target); pad is no token."""
    if layer.startswith("encoder"):
      source = np.asarray(batch["source"])
      return source, source != PAD_ID
    return np.asarray(batch["decoder_inputs"]), np.asarray(batch["weights"]) > 0

  def train_token_counts(self, data, vocab_size: int) -> np.ndarray:
    return data.train_token_counts(vocab_size)

  def eval_description(self, settings) -> dict:
    return {"mode": "teacher_forced_sentences", "seq_len": settings.eval.seq_len,
            "max_sentences": settings.eval.max_sentences}

  def final_report(self, run: RunView, params, split: str = "test") -> dict:
    """BLEU on ``split``'s sets (``decoding/bleu_report.py``), the pairs' mixing weights, the over-length counts."""
    cfg = run.config
    report = data_lib.write_length_report(run.data, run.workdir / "data", cfg.train.seq_len,
                                          cfg.eval.seq_len)
    weights = batch_lib.MixedPairIterator(run.data.split_sets("train"), cfg.train.batch_size,
                                          cfg.train.seq_len, cfg.seed,
                                          run.settings.data.sampling_temperature).weights
    return {"bleu": bleu_report(run.settings, run.data, params, split, mesh=run.mesh), "pair_weights": weights,
            "over_length": report}

"""BLEU of a model on a split's evaluation sets, per pair and set, shaped like the paper's Table 4."""
from __future__ import annotations

import numpy as np

from stablemoe_jax.core.settings import RunSettings
from stablemoe_jax.decoding import bleu
from stablemoe_jax.decoding.translate_lines import translate_lines
from stablemoe_jax.decoding.translator import make_translate_fn

# The set a pair's Table-4 column reports: Multi30k's 2016 Flickr test, the Bible's held-out test books.
PRIMARY_TEST_SETS = ("test_2016_flickr", "bible_test")
# decode.sets: "all" of a split's sets, or only each pair's "primary" one (the column of the table).
DECODE_SETS = ("all", "primary")


def primary_set_names(sets) -> dict[str, str]:
  """{pair: the name of its primary set}: the first of ``PRIMARY_TEST_SETS`` or "valid" it has, else its first."""
  named: dict[str, list[str]] = {}
  for s in sets:
    named.setdefault(s.pair, []).append(s.name)
  return {pair: next((n for n in (*PRIMARY_TEST_SETS, "valid") if n in names), names[0])
          for pair, names in named.items()}


def decode_settings(config) -> dict:
  dec = config.decode
  return {"beam_size": dec.beam_size, "length_penalty": dec.length_penalty,
          "max_len": dec.max_len or config.model.max_len, "length_penalty_form": "logprob_sum / length**a"}


def bleu_report(config: RunSettings, data, params, split: str, mesh=None) -> dict:
  """Cased sacreBLEU of every set of ``split`` ('valid' or 'test'), each pair's primary set and their average.

  Sources are translated from their first ``eval.seq_len`` tokens; ``eval.max_sentences > 0`` takes each set's
  first sentences only; ``decode.sets="primary"`` decodes only each pair's primary set (``primary_set_names``).
  ``mesh``: the run's, to split the sentences over its devices (``make_translate_fn``).
  """
  settings = decode_settings(config)
  translate_fn = make_translate_fn(config.model, settings["beam_size"], settings["max_len"],
                                   settings["length_penalty"], mesh=mesh)
  limit, decode = config.eval.max_sentences, config.decode
  sets, truncated, sentences, seconds, signature = {}, 0, 0, 0.0, ""
  split_sets = data.split_sets(split)
  primary_names = primary_set_names(split_sets)
  if decode.sets == "primary":
    split_sets = [s for s in split_sets if primary_names[s.pair] == s.name]
  for encoded in split_sets:
    sources, references = data.raw_text(encoded.pair, encoded.name)
    if limit > 0:
      sources, references = sources[:limit], references[:limit]
    out = translate_lines(translate_fn, params, data.tokenizer, encoded.pair.split("-")[0], sources,
                          config.decode.batch_size, config.eval.seq_len)
    score, signature = bleu.corpus_bleu(out.lines, references)
    sets.setdefault(encoded.pair, {})[encoded.name] = round(score, 2)
    truncated, sentences, seconds = truncated + out.truncated, sentences + len(sources), seconds + out.seconds
  primary = {pair: named[primary_names[pair]] for pair, named in sets.items()}
  return {"signature": signature, "split": split, "decode": settings, "per_pair": primary,
          "average": round(float(np.mean(list(primary.values()))), 2), "sets": sets,
          "truncated_sources": truncated, "max_sentences": limit, "decoded_sets": decode.sets,
          "sentences_per_second": round(sentences / max(seconds, 1e-9), 2)}

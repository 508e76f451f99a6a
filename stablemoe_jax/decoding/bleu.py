"""Corpus BLEU with sacreBLEU 2.x defaults: 13a tokenisation, cased, exponential smoothing, on detokenised text."""
from __future__ import annotations

from collections.abc import Sequence


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """BLEU (0-100) of one hypothesis per reference line, and sacreBLEU's signature of how it was computed
  (e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``)."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
  import sacrebleu  # here: its import cost every process that loads the training loop 0.8 s (shared cores)

  metric = sacrebleu.BLEU()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return float(score.score), str(metric.get_signature())

"""The multilingual LM probe (issue 50, part 3): the CPU default's model and budget on the union of the shared corpora.

Is multilinguality what makes the MoE pay in translation (configs/mt_cpu.py)? This trains the default's LM on PTB,
the Multi30k training sides in en / de / fr / cs and the Bible's training books in en / es, through the own-corpus
path (configs/lm_files.py) with one joint sentencepiece vocabulary of 8,000 pieces, and reports training loss and
each source's validation and test perplexity (summary.json "sets"). Its compare section runs dense, StableMoE (the
default's router) and Switch for seeds 0 and 1, paired with dense. From the repository root:

  python -m stablemoe_jax.data.prepare.union_corpus --data_dir /path/to/shared/data --out runs/union_corpus
  python -m stablemoe_jax.prepare --config configs/lm_multi_cpu.py --workdir runs/lm_multi --workers 0
  python -m stablemoe_jax.compare --config configs/lm_multi_cpu.py --workdir runs/lm_multi

(one run alone: python -m stablemoe_jax.main --config configs/lm_multi_cpu.py --workdir runs/lm_multi_one, after the
prepare command with that --workdir). A corpus written elsewhere: --config configs/lm_multi_cpu.py:DIR on each command.
"""
import ml_collections

from configs import compare_cpu
from configs import lm_files

# stablemoe_jax/data/prepare/union_corpus.py SOURCES (tests/data/lm/test_lm_multi.py checks they agree; configs/ may not
# import the data preparation).
SOURCES = ("ptb", "multi30k_en", "multi30k_de", "multi30k_fr", "multi30k_cs", "bible_en", "bible_es")


def _files(config: ml_collections.ConfigDict, corpus: str) -> None:
  config.data.train_files = f"{corpus}/train/*.txt"
  config.data.valid_files = f"{corpus}/valid/*.txt"  # the whole union's held-out text (the sources in name order)
  config.data.test_files = f"{corpus}/test/*.txt"
  config.data.eval_sets = ",".join(f"{source}={corpus}/{{split}}/{source}.txt" for source in SOURCES)


def get_config(corpus_dir: str = "runs/union_corpus") -> ml_collections.ConfigDict:
  """``corpus_dir``: the folder union_corpus wrote (relative to where the commands run); the globs follow it."""
  config = lm_files.get_config()  # the default's model, router and budget (850 steps of 16 x 128 tokens)
  config.data.sentencepiece_vocab_size = 8000  # one joint vocabulary over the seven sources' training text
  _files(config, corpus_dir)
  # The union's valid stream is its files in name order (bible_*, multi30k_*, ptb): a prefix of it would be the
  # Bible alone, so in-training evaluation and the final layer-worth measure score the whole split.
  config.train.eval_batches = 0
  config.health.contribution_batches = 0
  config.compare = compare_cpu.get_config().compare
  config.compare.methods = "dense,stablemoe,switch"
  config.compare.seeds = 2
  config.compare.results_dir = "results/lm_multi_cpu"  # each finished run's summary and metrics, committed
  return config

"""The paper's base LM (Table 2/8): 12 blocks, d=768, 32 experts of 3 sublayers, 60K steps (6K stage 1).

The paper trains on RoBERTa+CC100en with GPT-2 BPE (50,257 types) and 512K tokens per batch (512 sequences of
1024). This preset reads a corpus prepared on Apache Beam (``data.corpus=files``, sentencepiece with 50,257 pieces;
docs/data.md): prepare it once, then train from the same workdir. Your own corpus is the one override of the
prepare command, ``--config.data.train_files`` (with its valid and test files):

  python -m stablemoe_jax.prepare --config configs/lm_base.py --workdir runs/base --workers 16 \
    --config.data.train_files='/data/cc100/train-*.txt.zst' --config.data.valid_files=/data/cc100/valid.txt \
    --config.data.test_files=/data/cc100/test.txt
  python -m stablemoe_jax.main --config configs/lm_base.py --workdir runs/base

Without prepared shards in the workdir, ``main`` stops before anything is compiled or written, with one line naming
that command (exit status 2): it never falls back to Penn Treebank. To try the model on PTB anyway, say so:
``--config.data.corpus=ptb --config.data.tokenizer=word``.
The batch is accumulated over ``train.microbatches`` slices of 64 x 1024 tokens (split over all devices); raise it
if a slice does not fit in memory. Fits 1 to 64 devices with no override: 64 routing groups and a routing sample of
64 rows.
"""
from configs import default


def get_config():
  config = default.get_config()
  # The paper's corpus, prepared by `python -m stablemoe_jax.prepare` (keys as configs/lm_files.py).
  config.data.corpus = "files"
  config.data.tokenizer = "sentencepiece"
  config.data.sentencepiece_vocab_size = 50_257  # the paper's GPT-2 BPE size (here a sentencepiece unigram model)
  config.data.train_files = ""  # comma-separated globs of text, .gz or .zst: one sentence or document a line
  config.data.valid_files = ""
  config.data.test_files = ""
  config.data.tokenizer_files = ""  # globs of train files the tokenizer is built from; "": every train file
  config.model.d_model = 768
  config.model.num_heads = 12
  config.model.num_layers = 12
  config.model.d_ff = 3072
  config.model.max_len = 1024
  config.model.dropout = 0.0
  config.model.dtype = "bfloat16"
  # model.attention "auto" (the default) runs cuDNN's fused attention on a GPU in bf16. On ONE 80 GB GPU, 64 x 1024
  # microbatches need ~88 GiB of activations (experiment/plan.py estimate, not measured): use
  # --config.train.microbatches=16 or --config.model.remat=block there; an H200 (141 GB) fits the default.
  config.model.moe.num_experts = 32
  config.model.moe.sublayers_per_expert = 3
  # balance_scope "all" (from the CPU default) with the paper's dot-product routing, the pair measured at these
  # dimensions (docs/tuning_log.md, "Notes moved from the configs"); the default's cosine routing was not.
  config.model.moe.stablemoe.affinity, config.model.moe.stablemoe.cosine_dim = "dot", 0
  config.model.moe.eval_capacity_factor = 2.0
  # One routing group per 1024-token sequence of a microbatch: a multiple of any device count up to 64.
  config.model.moe.num_groups = 64
  config.train.steps = 60_000
  config.train.stage1_steps = 6_000
  config.train.batch_size = 512
  config.train.microbatches = 8
  config.train.seq_len = 1024
  config.train.learning_rate = 6e-4
  config.train.warmup_steps = 2_000
  config.train.log_every = 100
  config.train.eval_every = 2_000
  config.train.checkpoint_every = 2_000
  config.eval.batch_size = 64
  config.eval.seq_len = 1024
  # Routing records of 64 validation rows (one per device on up to 64 devices) every 250 steps: 240 records.
  config.analysis.sample_tokens = 64 * 1024
  config.analysis.record_every = 250
  return config

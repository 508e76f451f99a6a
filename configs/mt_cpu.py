"""CPU translation preset: StableMoE X->English on Multi30k (de, fr, cs) and the Bible (es), on 2 cores.

Run: python -m stablemoe_jax.main --config configs/mt_cpu.py --workdir runs/mt_cpu
The Bible's held-out books (no verse of them is trained on): valid Ruth, Jonah, Philippians;
test Esther, James, 1 John. Override any value, e.g. --config.train.steps=200.
"""
import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.task = "translation"

  config.data = ml_collections.ConfigDict()
  config.data.data_dir = ""  # "" -> $STABLEMOE_DATA_DIR (the folder holding multi30k/ and bible_es_en/)
  config.data.pairs = "de-en,fr-en,cs-en,es-en"
  config.data.bible_valid_books = "Ruth,Jonah,Phil"
  config.data.bible_test_books = "Esth,Jas,1John"
  config.data.sentencepiece_vocab_size = 8000  # one joint model over the training sources and targets
  config.data.sampling_temperature = 1.0  # pair weight ~ n_pair^(1/T); 1: proportional to its training pairs
  # Each batch is of one length bucket L in (16, 32, 64), [64 * 64 / L, L] (the same positions a step), so a short
  # pair fills more of its row (docs/translation.md). 1: every batch [64, 64].
  config.data.length_buckets = 3
  # True: pairs drawn in turn are packed into the batch's [64, 64] rows until one fits no row; each attends only
  # within its own pair (pairs a batch and real positions: docs/translation.md). Needs length_buckets = 1.
  config.data.pack_pairs = False

  model = config.model
  model.d_model, model.num_heads, model.num_layers, model.d_ff = 256, 4, 4, 1024  # 4 encoder + 4 decoder blocks
  model.max_len = 64
  model.dropout = 0.1
  model.moe.num_experts = 8
  model.moe.placement = "middle"  # after encoder block 2 and decoder block 2 (the paper: after the 3rd of 6)
  model.moe.sublayers_per_expert = 1
  # The paper's dot-product routing (the LM default's cosine routing was not measured on translation).
  model.moe.stablemoe.affinity, model.moe.stablemoe.cosine_dim = "dot", 0

  train = config.train
  train.steps = 1200  # about an hour on 2 quiet cores (the step time: docs/gpu.md, GPU-hours per preset)
  train.stage1_steps = 200
  train.batch_size = 64
  train.seq_len = 64  # source and target positions (tag and eos / bos included); longer pairs are counted, not used
  train.schedule = "inverse_sqrt"
  train.learning_rate = 1e-3
  train.warmup_steps = 200
  train.clip_norm = 0.1
  train.label_smoothing = 0.1
  train.log_every = 50
  train.eval_every = 500
  train.eval_batches = 10
  train.checkpoint_every = 500

  config.eval.batch_size = 64
  config.eval.seq_len = 64
  config.eval.max_sentences = 0  # > 0: only each evaluation set's first N sentences (quick checks)

  # Decoding (BLEU at the end of training, --mode=eval, --mode=translate).
  config.decode = ml_collections.ConfigDict()
  config.decode.beam_size = 5  # 1: greedy search
  config.decode.length_penalty = 1.0  # a finished hypothesis scores logprob_sum / length**a (fairseq's lenpen)
  config.decode.max_len = 0  # generated tokens (eos included); 0: model.max_len
  config.decode.batch_size = 64  # sentences decoded together
  config.decode.sets = "all"  # the final BLEU on every test set; "primary": each pair's table column only

  # Routing records of a fixed sample of validation pairs (encoder: sources, decoder: targets), 31 over the run.
  config.analysis.record_every = 100
  config.analysis.sample_tokens = 4096  # 64 pairs of train.seq_len
  config.analysis.report_at_end = True
  return config

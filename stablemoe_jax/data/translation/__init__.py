"""Parallel corpora of X->English translation (``config.task = "translation"``), in the order a run reads them:

    pipeline.load_translation_data
      -> corpora (Multi30k, the Bible) | files (your own files) | wmt (the paper's TFDS WMT pairs)
      -> joint_tokenizer (one sentencepiece model, language tags) -> pair_records (prepared pair shards)
      -> batches (EncodedSet, mixed-pair train batches in length buckets, eval batches)
"""

"""Language-model corpora (``config.task = "lm"``), in the order a run reads them:

    pipeline.load_lm_data (config -> tokenizer -> records; or grain_reader.load for `prepare`'s shards)
      -> builder (TFDS array_record, one record per line) -> stream (a split as one token stream)
      -> blocks (train blocks / eval rows) -> batches (LMData, grain batches)

``prepared`` reads a run's prepared data back without the raw corpus; ``token_counts`` counts a split's ids;
``download`` (one level up) fetches the Penn Treebank.
"""

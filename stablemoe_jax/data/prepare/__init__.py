"""Preparing corpora at any size on Apache Beam (the command: `python -m stablemoe_jax.prepare`).

    lm.py / translation.py (plan a config's shards, train its tokenizer, write the manifest)
      -> beam_pipeline.py (one task per shard, on Beam or inline) -> shard_writer.py (one shard's records)

It writes the formats that ``data/lm/`` and ``data/translation/`` read; nothing below it imports it.
"""

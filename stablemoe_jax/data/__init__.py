"""Corpora, tokenizers and input pipelines, split by what they serve (nothing here imports a model):

    common/       files on disk, plain text, raw inputs cut into shards, the LM tokenizers (both tasks)
    lm/           language-model corpora: tokenizer -> records -> token stream -> blocks -> grain batches
    translation/  parallel corpora (Multi30k, the Bible, WMT, your own files) -> joint sentencepiece -> pair batches
    prepare/      any corpus at any size into shards, on Apache Beam (the command: `python -m stablemoe_jax.prepare`,
                  ``stablemoe_jax/prepare.py``, above the layers)

Command-line entry points at this level: `python -m stablemoe_jax.data.download` (the Penn Treebank) and
`python -m stablemoe_jax.data.wmt` (WMT's TFDS records). Nothing downloads implicitly. The subpackages import only
downward: ``common`` and ``stablemoe_jax.core``; ``lm`` and ``translation`` also ``common``; ``prepare`` all three.
"""

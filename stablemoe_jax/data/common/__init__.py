"""What both tasks' data share: finding corpus files (``locate``), reading plain text (``text``), cutting raw
inputs into shards (``shards``) and the language model's tokenizers (``tokenizers``)."""

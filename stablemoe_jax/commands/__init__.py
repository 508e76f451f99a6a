"""The modes of ``python -m stablemoe_jax.main`` beyond train and eval, at the top of the layers (beside ``main``,
``cli`` and ``compare``): ``analyze`` (``--mode=analyze``: a checkpoint's routing analysis) and ``translate``
(``--mode=translate``: a file of sentences). They build the run's ``experiment.loop.Experiment``; no library module
imports them."""

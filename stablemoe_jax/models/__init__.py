"""Flax modules: the Transformer LM, the encoder-decoder, the MoE layer, its routers and dispatchers.

Shape letters (every docstring in ``models/`` uses these; a module's own names are spelled out where it uses them):

====== ==========================================================================================================
B      rows (sequences) of a batch
S      positions a row; Ss / St the source / target positions of the encoder-decoder, Sq / Sk an attention's
       query / key positions, L the cached positions of decoding
T      tokens one MoE layer routes: B * S, flattened
d      model width (``model.d_model``); f an FFN's hidden width (``d_ff``); H attention heads, Dh = d / H
V      vocabulary (``model.vocab_size``); Vp the embedding's rows, padded to ``model.vocab_multiple`` (``head.py``)
N      experts (``model.moe.num_experts``); N' the experts one device holds (N / the mesh's ``expert`` axis)
k      experts a token is routed to (top-k; 1 for top-1 routers)
s      FFN sublayers an expert stacks (``sublayers_per_expert`` over the MoE layers)
dim    the projection width of the distilled router or of cosine routing (their ``dim``)
G      routing groups of one MoE layer (``model.moe.num_groups``); G' the groups one device holds
Tg     rows a group routes: T / G tokens (top-k: k * T / G choices, each a row)
C      capacity: slots per (group, expert), ``ceil(capacity_factor * Tg / N)``
R      expert-sorted rows of the grouped dispatcher: nb blocks of b rows
====== ==========================================================================================================

Where the modules are: ``transformer.py`` and ``seq2seq.py`` (the models), ``head.py`` (the tied head), ``moe.py``
(the layer), ``routing.py`` / ``routers.py`` and the ``*_router.py`` files (routing), ``capacity.py`` (slots),
``dispatch.py`` (moving tokens to the experts and choosing how), ``grouped_dispatch.py``, ``buffers.py``,
``experts.py`` (the expert stacks).
"""

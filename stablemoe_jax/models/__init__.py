"""Flax modules: the Transformer LM, the MoE layer and its routers."""

"""The ``model`` and ``model.moe`` config sections as frozen dataclasses (each router's own section:
``settings/routers.py``). The defaults are the CPU default's (configs/default.py is built from them); ``absent``
metadata: what a config written before the key existed means (``settings.typed`` fills a missing key with it). The
values' checks: ``models/checks.py``."""
from __future__ import annotations

import dataclasses

from stablemoe_jax.core.settings.routers import (BaseSettings, DeepSeekSettings, DistilledRouterSettings,
                                                 HashSettings, StableMoESettings, SwitchSettings, section,
                                                 setting)



@dataclasses.dataclass(frozen=True)
class MoESettings:
  """``model.moe``: the MoE layers, their dispatch, and each router's own section (read and validated only when that
  router is chosen; changing one of an unselected router is an error but for its ``preset_keys``)."""

  enabled: bool = setting(True, "False: a dense model (or a dense baseline with model.dense_match)")
  router: str = setting("stablemoe", "stablemoe | switch | base | hash | deepseek (models/routers.py)")
  num_experts: int = setting(8, "experts N of each MoE layer")
  placement: str = setting("middle", "where the MoE layers go: bottom | middle | top | scattered")
  sublayers_per_expert: int = setting(2, "FFN sublayers of each expert")
  d_ff: int = setting(0, "each expert's FFN width; 0: model.d_ff")
  capacity_factor: float = setting(2.0, "training capacity ceil(cf * T / G / E) per (group, expert)")
  eval_capacity_factor: float = setting(0.0, "evaluation's capacity factor; <= 0: no token is dropped")
  num_groups: int = setting(0, "routing groups G, a multiple of the devices: capacity ceil(cf * T / G / E) per "
                               "(group, expert); 0: one per device, chosen at launch and recorded with the run (a "
                               "resumption or evaluation elsewhere routes the same way)",
                            absent=1)
  shuffle_tokens: bool = setting(True, "training: random order within a group before capacity (drops random)",
                                 absent=False)
  dispatcher: str = setting("auto", "auto (all_to_all if mesh.expert > 1, else index) | index | all_to_all | "
                                    "grouped | one_hot (benchmark)")
  eval_dispatcher: str = setting("auto", "evaluation's: auto (grouped if no token can be dropped and mesh.expert "
                                         "== 1, else as training) | any dispatcher")
  block_size: int = setting(128, "grouped dispatcher: rows per block; each expert's rows padded to a multiple")
  expert_bias_init: str = setting("zeros", "expert FFN biases: zeros (each expert adds exactly 0 at first) | torch "
                                           "(the authors' code: PyTorch's nn.Linear bias U(+-1/sqrt(fan_in)), only the "
                                           "output weight zeroed; its probe: docs/tuning_log.md)")
  shared_experts: int = setting(0, "always-on expert FFNs (each as one routed expert) every token goes through, "
                                   "added to the routed output, for any router (DeepSeekMoE); 0: none", added=True)
  stablemoe: StableMoESettings = section(StableMoESettings, "router stablemoe's settings")
  switch: SwitchSettings = section(SwitchSettings, "router switch's settings")
  base: BaseSettings = section(BaseSettings, "router base's settings")
  hash: HashSettings = section(HashSettings, "router hash's settings")
  deepseek: DeepSeekSettings = section(DeepSeekSettings, "router deepseek's settings")
  distilled_router: DistilledRouterSettings = section(DistilledRouterSettings, "the shared distilled router")

  def router_settings(self, name: str | None = None):
    """The section of router ``name`` (default: the chosen one)."""
    return getattr(self, name or self.router)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """``model``: the Transformer (LM, or encoder-decoder for translation) and its MoE layers."""

  vocab_size: int = setting(0, "0: the tokenizer's; otherwise must be >= it")
  d_model: int = setting(256, "model width")
  num_heads: int = setting(4, "attention heads")
  num_layers: int = setting(4, "Transformer blocks (translation: of the encoder and of the decoder each)")
  d_ff: int = setting(1024, "dense FFN width")
  max_len: int = setting(128, "positions of the learned position embedding")
  dropout: float = setting(0.05, "dropout rate")
  dtype: str = setting("float32", "compute dtype: float32 | bfloat16 | float16 (parameters stay float32)")
  attention: str = setting("auto", "jax.nn.dot_product_attention implementation: auto (cudnn on a GPU in "
                                   "bf16/fp16, else xla) | xla | cudnn")
  remat: str = setting("none", "recompute decoder blocks and MoE layers in the backward pass: none | block | "
                               "block_dots_saveable (saves weight-matmul outputs); none: the CPU sizes need none "
                               "(block's cost: docs/speed.md, remat)")
  dense_match: str = setting("none", "a dense baseline (no MoE layer) matched to the MoE model model.moe describes: "
                                     "none | deeper (its total parameters, more FFN sublayers where the MoE layers "
                                     "were) | wider (the same, wider) | flops (one expert's FFN there: the compute "
                                     "of a token of a top-1 MoE layer)")
  loss_chunk_tokens: int = setting(0, "the LM head and its loss in chunks of this many tokens under "
                                      "jax.checkpoint, never writing the float32 [tokens, vocabulary] logits "
                                      "(models/head.py; docs/speed.md); 0: off")
  vocab_multiple: int = setting(0, "round the embedding's rows up to a multiple of this (128: 50,257 -> 50,304 "
                                   "for GPT-2's BPE); the padded ids are never scored or decoded; 0: off (an old "
                                   "checkpoint restores only with it off, or where it pads nothing)")
  moe: MoESettings = section(MoESettings, "the MoE layers")

  @property
  def has_moe_layers(self) -> bool:
    """Whether the model has MoE layers (a dense baseline has none)."""
    return bool(self.moe.enabled and self.dense_match == "none")

"""The ``model`` and ``model.moe`` config sections as frozen dataclasses (each router's own section:
``settings/routers.py``). Defaults are configs/default.py's; ``absent`` metadata: what a config written before the
key existed means (``settings.typed`` fills a missing key with it). The values' checks: ``models/checks.py``."""
from __future__ import annotations

import dataclasses

from stablemoe_jax.core.settings.routers import (BaseSettings, DeepSeekSettings, DistilledRouterSettings,
                                                 HashSettings, StableMoESettings, SwitchSettings, setting)


def _section(cls, help: str):  # noqa: A002
  return dataclasses.field(default_factory=cls, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class MoESettings:
  """``model.moe``: the MoE layers, their dispatch, and each router's own section."""

  enabled: bool = setting(True, "False: a dense model (or a dense baseline with model.dense_match)")
  router: str = setting("stablemoe", "stablemoe | switch | base | hash | deepseek (models/routers.py)")
  num_experts: int = setting(8, "experts N of each MoE layer")
  placement: str = setting("middle", "where the MoE layers go: bottom | middle | top | scattered")
  sublayers_per_expert: int = setting(2, "FFN sublayers of each expert")
  d_ff: int = setting(0, "each expert's FFN width; 0: model.d_ff")
  capacity_factor: float = setting(2.0, "training capacity ceil(cf * T / G / E) per (group, expert)")
  eval_capacity_factor: float = setting(0.0, "evaluation's capacity factor; <= 0: no token is dropped")
  num_groups: int = setting(0, "routing groups G, a multiple of the devices; 0: one per device, recorded at launch",
                            absent=1)
  shuffle_tokens: bool = setting(True, "training: random order within a group before capacity (drops random)",
                                 absent=False)
  dispatcher: str = setting("auto", "auto | index | all_to_all | grouped | one_hot (benchmark)")
  eval_dispatcher: str = setting("auto", "evaluation's: auto (grouped if no drop and mesh.expert == 1) | any")
  block_size: int = setting(128, "grouped dispatcher: rows per block; each expert's rows padded to a multiple")
  expert_bias_init: str = setting("zeros", "expert FFN biases: zeros | torch (PyTorch's nn.Linear default)")
  shared_experts: int = setting(0, "always-on expert FFNs every token goes through (DeepSeekMoE); 0: none")
  stablemoe: StableMoESettings = _section(StableMoESettings, "router stablemoe's settings")
  switch: SwitchSettings = _section(SwitchSettings, "router switch's settings")
  base: BaseSettings = _section(BaseSettings, "router base's settings")
  hash: HashSettings = _section(HashSettings, "router hash's settings")
  deepseek: DeepSeekSettings = _section(DeepSeekSettings, "router deepseek's settings")
  distilled_router: DistilledRouterSettings = _section(DistilledRouterSettings, "the shared distilled router")

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
  attention: str = setting("auto", "jax.nn.dot_product_attention implementation: auto | xla | cudnn")
  remat: str = setting("none", "recompute in the backward pass: none | block | block_dots_saveable")
  dense_match: str = setting("none", "dense baseline matched to model.moe: none | deeper | wider | flops")
  loss_chunk_tokens: int = setting(0, "the LM head and loss in chunks of this many tokens; 0: off")
  vocab_multiple: int = setting(0, "round the embedding's rows up to a multiple of this; 0: off")
  moe: MoESettings = _section(MoESettings, "the MoE layers")

  @property
  def has_moe_layers(self) -> bool:
    """Whether the model has MoE layers (a dense baseline has none)."""
    return bool(self.moe.enabled and self.dense_match == "none")

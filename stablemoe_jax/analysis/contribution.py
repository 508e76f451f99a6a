"""What each MoE layer contributes: the validation loss with that layer's expert outputs set to zero.

An expert is a stack of pre-LN residual FFN sublayers ``y <- y + FFN_i(y)`` and the layer adds
``gate * (stack(x) - x)`` (``experts.apply_ffn_experts``). With every sublayer's ``w_out`` and ``b_out``
zero, each FFN_i outputs exactly 0 (dropout included: it only scales or zeroes that 0), so the stack
is the identity, the expert output is exactly 0 and the layer passes every token unchanged: the
model with the layer removed, with no other parameter changed.

With shared experts (``model.moe.shared_experts``, ``shared_experts`` beside ``experts``) "removing the layer" is
removing its routed experts: their output set to zero, the shared ones kept. That is the layer's worth the verdict
judges (``relative_perplexity_increase``): what routing adds beside the always-on FFNs, so whether routing pays;
a layer whose routed experts do nothing is dead even when its shared experts work. The final measure
(:func:`experiment_contributions`, ``whole_layer=True``) adds the whole layer's worth, shared experts removed too
(``whole_layer_relative_perplexity_increase``), one more evaluation for each layer that has shared experts.
Without shared experts the two are the same and only the first is given.

A model with more than one MoE layer (translation: one in the encoder, one in the decoder) is also measured with all
of them removed at once (``all_layers``): the worth of its MoE as a whole, which the health verdict judges the model
by (a layer under the line while another works is weak, not a dead model: ``train/health.py``). With one MoE layer
that is the layer's own measure, and nothing is added.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stablemoe_jax.analysis.routes import sorted_layers
from stablemoe_jax.core.run_view import RunView

ZEROED = ("w_out", "b_out")  # the expert parameters that make every residual sublayer the identity
SHARED_EXPERTS = "shared_experts"  # a MoE layer's always-on experts (models/moe.py), apart from the routed "experts"


def moe_layer_names(params: dict) -> list[str]:
  """The MoE layers of a model's params in model order: ``moe_0``, ... (LM), ``encoder_moe_0``, ``decoder_moe_0``,
  ... (translation); [] for a dense model."""
  return sorted_layers([name for name, sub in params.items()
                        if name.split("_", 1)[-1].startswith("moe_") or name.startswith("moe_")
                        if isinstance(sub, dict) and "experts" in sub])


def _zeros_like(leaf):
  if isinstance(leaf, jax.Array):
    return jax.device_put(jnp.zeros(leaf.shape, leaf.dtype), leaf.sharding)  # same layout: no recompilation
  return np.zeros_like(leaf)


def has_shared_experts(params: dict, layer: str) -> bool:
  return SHARED_EXPERTS in params[layer]


def without_layer(params: dict, layer: str, shared: bool = False) -> dict:
  """A copy of ``params`` (sharing every other leaf) in which MoE layer ``layer``'s routed experts output exactly 0:
  without shared experts the layer then outputs exactly its input. ``shared``: the shared experts' output too, so
  that a layer with them outputs its input as well."""
  if layer not in moe_layer_names(params):
    raise KeyError(f"{layer!r} is not a MoE layer of these params; they have {moe_layer_names(params)}.")
  zeroed = ("experts", SHARED_EXPERTS) if shared and has_shared_experts(params, layer) else ("experts",)
  ablated = dict(params[layer])
  for module in zeroed:
    experts = dict(ablated[module])
    for name in ZEROED:
      experts[name] = _zeros_like(experts[name])
    ablated[module] = experts
  return {**params, layer: ablated}


def without_layers(params: dict, layers: list[str]) -> dict:
  """:func:`without_layer` of every layer in ``layers`` at once (their routed experts output exactly 0)."""
  for layer in layers:
    params = without_layer(params, layer)
  return params


def layer_contributions(evaluate, params: dict, max_batches: int = 0, full: dict | None = None,
                        whole_layer: bool = False) -> dict:
  """The loss on the evaluated split with and without each MoE layer (its routed experts: the module doc).

  Args:
    evaluate: ``(params, max_batches) -> {"loss", "perplexity", "tokens"}`` on one split (``Experiment.evaluate``
      with its split bound); both losses of a layer are on the same batches.
    params: the model's parameters.
    max_batches: > 0: the first ``max_batches`` batches of the split; <= 0: all of it.
    full: ``evaluate(params, max_batches)``'s result when the caller has it already (training's evaluation
      points), so that only the ablated models are evaluated here.
    whole_layer: also, for each layer with shared experts, the loss without the whole layer (``..._whole_layer``).

  Returns:
    ``{"batches", "tokens", "loss", "perplexity", "layers": {layer: {"loss_without_layer",
    "perplexity_without_layer", "relative_perplexity_increase"}}}``; ``layers`` is {} for a dense model.
    The relative increase is ``ppl_without / ppl - 1`` (0: the layer does nothing for the loss). With
    ``whole_layer``, a layer with shared experts adds ``"loss_without_whole_layer"``,
    ``"perplexity_without_whole_layer"`` and ``"whole_layer_relative_perplexity_increase"``. A dense model
    is not evaluated at all: its result has only ``batches`` and an empty ``layers``. A model with more than one
    MoE layer adds ``"all_layers": {"layers", "loss_without_layers", "perplexity_without_layers",
    "relative_perplexity_increase"}``: every MoE layer's routed experts removed at once.
  """
  batches = max_batches if max_batches > 0 else "all"
  if not moe_layer_names(params):
    return {"batches": batches, "layers": {}}
  full = full if full is not None else evaluate(params, max_batches)
  layers = {}
  for layer in moe_layer_names(params):
    ablated = evaluate(without_layer(params, layer), max_batches)
    layers[layer] = {"loss_without_layer": ablated["loss"], "perplexity_without_layer": ablated["perplexity"],
                     "relative_perplexity_increase": ablated["perplexity"] / full["perplexity"] - 1.0}
    if whole_layer and has_shared_experts(params, layer):
      whole = evaluate(without_layer(params, layer, shared=True), max_batches)
      layers[layer].update(loss_without_whole_layer=whole["loss"], perplexity_without_whole_layer=whole["perplexity"],
                           whole_layer_relative_perplexity_increase=whole["perplexity"] / full["perplexity"] - 1.0)
  result = {"batches": batches, "tokens": full["tokens"], "loss": full["loss"],
            "perplexity": full["perplexity"], "layers": layers}
  if len(layers) > 1:
    names = moe_layer_names(params)
    ablated = evaluate(without_layers(params, names), max_batches)
    result["all_layers"] = {"layers": names, "loss_without_layers": ablated["loss"],
                            "perplexity_without_layers": ablated["perplexity"],
                            "relative_perplexity_increase": ablated["perplexity"] / full["perplexity"] - 1.0}
  return result


def experiment_contributions(run: RunView, params: dict, split: str = "valid") -> dict:
  """:func:`layer_contributions` of a run on ``split``'s first ``health.contribution_batches`` batches, the whole
  layer's worth included where a layer has shared experts."""
  max_batches = int(run.settings.health.contribution_batches)
  result = layer_contributions(lambda p, n: run.evaluate(p, split, n), params, max_batches, whole_layer=True)
  return {"split": split, **result}

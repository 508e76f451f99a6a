"""The ``model`` config section (``model.moe``, each router's own settings, ``mesh.expert`` against the experts):
what ``config_validation.validate_config`` asks of the models package. Raises ``ConfigError``."""
from __future__ import annotations

from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.errors import ConfigError, require
from stablemoe_jax.models.dispatch import DEFAULT_BLOCK_SIZE, DISPATCHER_NAMES, SINGLE_DEVICE_DISPATCHERS
from stablemoe_jax.models.distill import DISTILLED_KINDS
from stablemoe_jax.models.experts import EXPERT_BIAS_INITS
from stablemoe_jax.models.routers import ROUTERS
from stablemoe_jax.models.transformer import (ATTENTION_IMPLEMENTATIONS, PLACEMENTS, REMAT_POLICIES,
                                               attention_implementation)
from stablemoe_jax.parallel import mesh as mesh_lib

DTYPES = ("float32", "bfloat16", "float16")
DENSE_MATCHES = ("none", "deeper", "wider", "flops")


def check_model(model: settings_lib.ModelSettings, data_vocab_size: int | None = None) -> None:
  """The model's shape, dtype, attention, remat and vocabulary (``data_vocab_size``: the tokenizer's, once known)."""
  require(model.d_model % model.num_heads == 0,
          f"model.d_model={model.d_model} must be divisible by model.num_heads={model.num_heads}.")
  require(0.0 <= model.dropout < 1.0, f"model.dropout={model.dropout} must lie in [0, 1).")
  require(model.dtype in DTYPES, f"model.dtype={model.dtype!r} is unknown; choose one of {DTYPES}.")
  attention = model.attention
  require(attention in ATTENTION_IMPLEMENTATIONS,
          f"model.attention={attention!r} is unknown; choose one of {ATTENTION_IMPLEMENTATIONS}.")
  require(attention != "cudnn" or model.dtype in ("bfloat16", "float16"),
          f"model.attention='cudnn' needs model.dtype bfloat16 or float16 (got {model.dtype!r}); "
          f"use --config.model.attention=auto or --config.model.dtype=bfloat16.")
  remat = model.remat
  require(remat in REMAT_POLICIES, f"model.remat={remat!r} is unknown; choose one of {tuple(REMAT_POLICIES)}.")
  require(model.vocab_size >= 0, f"model.vocab_size={model.vocab_size} must be >= 0 (0: the tokenizer's).")
  for key, meaning in (("loss_chunk_tokens", "tokens per chunk of the head's loss, e.g. 4096"),
                       ("vocab_multiple", "the multiple the vocabulary is padded to, e.g. 128")):
    value = getattr(model, key)
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            f"model.{key}={value!r} must be an integer >= 0 ({meaning}; 0: off); "
            f"set --config.model.{key}=0 or a positive integer.")
  if data_vocab_size is not None and model.vocab_size:
    require(
        model.vocab_size >= data_vocab_size,
        f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's vocabulary "
        f"({data_vocab_size}); set --config.model.vocab_size=0 to use the tokenizer's size.",
    )


def check_moe(run: settings_lib.RunSettings) -> None:
  """``model.moe`` (experts, placement, capacity, groups, dispatchers), the chosen router, ``mesh.expert``."""
  model, moe, train, mesh = run.model, run.model.moe, run.train, run.mesh
  if moe.enabled or model.dense_match != "none":
    require(moe.num_experts > 0, f"model.moe.num_experts={moe.num_experts} must be positive.")
    require(moe.router in ROUTERS, f"model.moe.router={moe.router!r} is unknown; choose one of {sorted(ROUTERS)}.")
    require(moe.placement in PLACEMENTS,
            f"model.moe.placement={moe.placement!r} is unknown; choose one of {PLACEMENTS}.")
    require(moe.capacity_factor > 0,
            f"model.moe.capacity_factor={moe.capacity_factor} must be > 0 (the paper's code uses 2.0).")
    require(moe.sublayers_per_expert > 0,
            f"model.moe.sublayers_per_expert={moe.sublayers_per_expert} must be positive.")
    require(moe.num_groups >= 0, f"model.moe.num_groups={moe.num_groups} must be >= 0 (1: one routing group; 0: one "
                                 f"per device, chosen at launch and recorded with the run).")
    shared = moe.shared_experts
    require(isinstance(shared, int) and not isinstance(shared, bool) and shared >= 0,
            f"model.moe.shared_experts={shared!r} must be an integer >= 0 (always-on experts beside the routed ones; "
            f"0: none).")
    require(moe.expert_bias_init in EXPERT_BIAS_INITS,
            f"model.moe.expert_bias_init={moe.expert_bias_init!r} is unknown; choose one of "
            f"{EXPERT_BIAS_INITS} (torch: the authors' code's PyTorch default).")
    for section, rows in (("train", train.batch_size // train.microbatches), ("eval", run.eval.batch_size)):
      if not moe.num_groups:  # 0: one group per device, checked once the launch resolves it (check_devices)
        break
      tokens = rows * getattr(run, section).seq_len
      require(tokens % moe.num_groups == 0,
              f"model.moe.num_groups={moe.num_groups} must divide the {tokens} tokens of a {section} batch "
              f"({section} rows x {section}.seq_len); choose a divisor of {tokens}.")
    require(moe.dispatcher in DISPATCHER_NAMES,
            f"model.moe.dispatcher={moe.dispatcher!r} is unknown; choose one of {DISPATCHER_NAMES}.")
    eval_dispatcher = moe.eval_dispatcher
    require(eval_dispatcher in DISPATCHER_NAMES,
            f"model.moe.eval_dispatcher={eval_dispatcher!r} is unknown; choose one of {DISPATCHER_NAMES}.")
    block_size = moe.block_size
    require(block_size > 0, f"model.moe.block_size={block_size} must be positive (rows per block of the "
                            f"grouped dispatcher; {DEFAULT_BLOCK_SIZE} by default).")
    for key, name in (("dispatcher", moe.dispatcher), ("eval_dispatcher", eval_dispatcher)):
      require(name not in SINGLE_DEVICE_DISPATCHERS or mesh.expert == 1,
              f"model.moe.{key}={name!r} has no expert parallelism, but mesh.expert={mesh.expert}; "
              f"use --config.model.moe.{key}=auto (all_to_all over the expert axis) or --config.mesh.expert=1.")
    require(mesh.expert > 0 and moe.num_experts % mesh.expert == 0,
            f"mesh.expert={mesh.expert} must divide model.moe.num_experts={moe.num_experts}; "
            f"set --config.mesh.expert to a divisor of {moe.num_experts}.")
    _check_routers(run)
  require(model.has_moe_layers or mesh.expert == 1,
          f"mesh.expert={mesh.expert}, but a dense model has no experts to split over devices; "
          f"set --config.mesh.expert=1 (every device then takes a share of the batch).")
  require(model.dense_match in DENSE_MATCHES,
          f"model.dense_match={model.dense_match!r} is unknown; choose one of {DENSE_MATCHES}.")


def check_devices(config, device_count: int) -> None:
  """What a launch on ``device_count`` devices asks of the model and the mesh: ``mesh.expert``, whole rows of every
  batch on every device, and ``model.moe.num_groups`` a multiple of the devices (``config`` resolved by
  ``parallel.mesh.resolve_layout``, so the checks of ``check_moe`` that need the number of groups have run)."""
  mesh_lib.check_layout(config, device_count)


def check_backend(model: settings_lib.ModelSettings, backend: str) -> None:
  """Raises ConfigError if the model cannot run on JAX backend ``backend`` ("cpu", "gpu", "tpu")."""
  try:
    attention_implementation(model, backend)
  except ValueError as error:
    raise ConfigError(str(error)) from None


def _check_routers(run: settings_lib.RunSettings) -> None:
  """The chosen router's own settings, and no changed setting of a router that is not chosen."""
  moe, train = run.model.moe, run.train
  entry = ROUTERS[moe.router]
  settings = moe.router_settings()
  for problem in entry.check(settings, moe):
    raise ConfigError(problem)
  for name in sorted(ROUTERS):
    if name == moe.router:
      continue
    for key, value in ROUTERS[name].unselected_changes(moe.router_settings(name)):
      raise ConfigError(
          f"model.moe.{name}.{key}={value!r} is a setting of router {name!r}, but model.moe.router={moe.router!r} "
          f"would ignore it; choose that router with --config.model.moe.router={name}, or drop the "
          f"--config.model.moe.{name}.{key} override.")
  distilled = moe.distilled_router
  if entry.uses_distilled_router(settings):
    require(distilled.kind in DISTILLED_KINDS,
            f"model.moe.distilled_router.kind={distilled.kind!r} is unknown; choose one of {DISTILLED_KINDS}.")
    for key in ("dim", "kernel_size", "num_layers", "num_heads"):
      require(getattr(distilled, key) > 0,
              f"model.moe.distilled_router.{key}={getattr(distilled, key)} must be positive.")
    require(distilled.distill_weight >= 0,
            f"model.moe.distilled_router.distill_weight={distilled.distill_weight} must be >= 0.")
    require(distilled.kind != "transformer" or distilled.dim % distilled.num_heads == 0,
            f"model.moe.distilled_router.dim={distilled.dim} must be divisible by "
            f"model.moe.distilled_router.num_heads={distilled.num_heads}.")
  if moe.router == "base":
    groups = int(moe.num_groups or 1)  # 0 (one group per device): 1 here, the number once resolved
    tokens = train.batch_size // train.microbatches * train.seq_len
    require(tokens % (groups * moe.num_experts) == 0,
            f"router 'base' gives every expert exactly 1/N of a routing group, but a step's {tokens} tokens "
            f"(train.batch_size / train.microbatches x train.seq_len) are not divisible by model.moe.num_groups "
            f"({groups}) x model.moe.num_experts ({moe.num_experts}); change train.batch_size or train.seq_len.")

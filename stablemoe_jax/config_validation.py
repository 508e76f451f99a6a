"""Checks a config for values that cannot work, before anything is built or compiled."""
from __future__ import annotations

from stablemoe_jax.models.distill import DISTILLED_KINDS
from stablemoe_jax.models.dispatch import DEFAULT_BLOCK_SIZE, DISPATCHER_NAMES, SINGLE_DEVICE_DISPATCHERS
from stablemoe_jax.models.experts import EXPERT_BIAS_INITS
from stablemoe_jax.models.routers import ROUTERS
from stablemoe_jax.models.transformer import (ATTENTION_IMPLEMENTATIONS, PLACEMENTS, REMAT_POLICIES,
                                               attention_implementation)
from stablemoe_jax.tasks import TASK_NAMES
from stablemoe_jax.train import health as health_lib

DTYPES = ("float32", "bfloat16", "float16")
DENSE_MATCHES = ("none", "deeper", "wider")
SCHEDULES = ("linear", "inverse_sqrt")


class ConfigError(ValueError):
  """A config value is unknown or inconsistent; the message names the key and the fix."""


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def validate_config(config, data_vocab_size: int | None = None) -> None:
  """Raises ConfigError for the first bad value found.

  Args:
    config: the full run config.
    data_vocab_size: the tokenizer's vocabulary size, once known; checked
      against ``model.vocab_size``.
  """
  model, moe, train = config.model, config.model.moe, config.train
  task = config.get("task", "lm")
  _require(task in TASK_NAMES, f"task={task!r} is unknown; choose one of {TASK_NAMES}.")
  _require(train.steps > 0, f"train.steps={train.steps} must be positive.")
  _require(
      0 <= train.stage1_steps <= train.steps,
      f"train.stage1_steps={train.stage1_steps} must lie in [0, train.steps={train.steps}]; "
      f"set --config.train.stage1_steps to at most {train.steps} (the paper uses 10% of the steps).",
  )
  _require(0 <= train.warmup_steps < train.steps,
           f"train.warmup_steps={train.warmup_steps} must lie in [0, train.steps={train.steps}).")
  _require(train.batch_size > 0, f"train.batch_size={train.batch_size} must be positive.")
  _require(train.microbatches > 0 and train.batch_size % train.microbatches == 0,
           f"train.batch_size={train.batch_size} must be a positive multiple of "
           f"train.microbatches={train.microbatches}.")
  _require(train.learning_rate > 0, f"train.learning_rate={train.learning_rate} must be positive.")
  _require(train.get("router_lr_scale", 1.0) > 0,
           f"train.router_lr_scale={train.get('router_lr_scale')} must be > 0 (1: the routers share the lr).")
  _require(train.get("router_warmup_steps", 0) >= 0,
           f"train.router_warmup_steps={train.get('router_warmup_steps')} must be >= 0 (0: no router warmup).")
  for key in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    _require(train[key] > 0, f"train.{key}={train[key]} must be positive.")
  for section in ("train", "eval"):
    seq_len = config[section].seq_len
    _require(0 < seq_len <= model.max_len,
             f"{section}.seq_len={seq_len} must lie in (0, model.max_len={model.max_len}]; "
             f"raise --config.model.max_len or lower --config.{section}.seq_len.")
  stride = config.eval.get("stride", 0)
  _require(0 <= stride <= config.eval.seq_len,
           f"eval.stride={stride} must lie in [0, eval.seq_len={config.eval.seq_len}]; 0 or eval.seq_len scores "
           f"non-overlapping blocks, a smaller stride sliding windows (e.g. --config.eval.stride=64).")
  _require(model.d_model % model.num_heads == 0,
           f"model.d_model={model.d_model} must be divisible by model.num_heads={model.num_heads}.")
  _require(0.0 <= model.dropout < 1.0, f"model.dropout={model.dropout} must lie in [0, 1).")
  _require(model.dtype in DTYPES, f"model.dtype={model.dtype!r} is unknown; choose one of {DTYPES}.")
  attention = model.get("attention", "auto")
  _require(attention in ATTENTION_IMPLEMENTATIONS,
           f"model.attention={attention!r} is unknown; choose one of {ATTENTION_IMPLEMENTATIONS}.")
  _require(attention != "cudnn" or model.dtype in ("bfloat16", "float16"),
           f"model.attention='cudnn' needs model.dtype bfloat16 or float16 (got {model.dtype!r}); "
           f"use --config.model.attention=auto or --config.model.dtype=bfloat16.")
  remat = model.get("remat", "none")
  _require(remat in REMAT_POLICIES, f"model.remat={remat!r} is unknown; choose one of {tuple(REMAT_POLICIES)}.")
  _require(model.vocab_size >= 0, f"model.vocab_size={model.vocab_size} must be >= 0 (0: the tokenizer's).")
  if data_vocab_size is not None and model.vocab_size:
    _require(
        model.vocab_size >= data_vocab_size,
        f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's vocabulary "
        f"({data_vocab_size}); set --config.model.vocab_size=0 to use the tokenizer's size.",
    )
  _check_health(config)
  analysis = config.analysis  # routing analysis
  _require(analysis.record_every >= 0, f"analysis.record_every={analysis.record_every} must be >= 0 (0: no records).")
  _require(analysis.sample_tokens >= train.seq_len,
           f"analysis.sample_tokens={analysis.sample_tokens} must be at least train.seq_len={train.seq_len} "
           f"(the sample is whole rows of train.seq_len tokens); raise --config.analysis.sample_tokens.")
  _require(analysis.top_tokens > 0, f"analysis.top_tokens={analysis.top_tokens} must be positive.")
  if moe.enabled or model.get("dense_match", "none") != "none":
    _require(moe.num_experts > 0, f"model.moe.num_experts={moe.num_experts} must be positive.")
    _require(moe.router in ROUTERS, f"model.moe.router={moe.router!r} is unknown; choose one of {sorted(ROUTERS)}.")
    _require(moe.placement in PLACEMENTS,
             f"model.moe.placement={moe.placement!r} is unknown; choose one of {PLACEMENTS}.")
    _require(moe.capacity_factor > 0,
             f"model.moe.capacity_factor={moe.capacity_factor} must be > 0 (the paper's code uses 2.0).")
    _require(moe.sublayers_per_expert > 0,
             f"model.moe.sublayers_per_expert={moe.sublayers_per_expert} must be positive.")
    _require(moe.num_groups > 0, f"model.moe.num_groups={moe.num_groups} must be positive (1: one routing group).")
    _require(moe.get("expert_bias_init", "zeros") in EXPERT_BIAS_INITS,
             f"model.moe.expert_bias_init={moe.get('expert_bias_init')!r} is unknown; choose one of "
             f"{EXPERT_BIAS_INITS} (torch: the authors' code's PyTorch default).")
    for section, rows in (("train", train.batch_size // train.microbatches), ("eval", config.eval.batch_size)):
      tokens = rows * config[section].seq_len
      _require(tokens % moe.num_groups == 0,
               f"model.moe.num_groups={moe.num_groups} must divide the {tokens} tokens of a {section} batch "
               f"({section} rows x {section}.seq_len); choose a divisor of {tokens}.")
    _require(moe.dispatcher in DISPATCHER_NAMES,
             f"model.moe.dispatcher={moe.dispatcher!r} is unknown; choose one of {DISPATCHER_NAMES}.")
    eval_dispatcher = moe.get("eval_dispatcher", "auto")
    _require(eval_dispatcher in DISPATCHER_NAMES,
             f"model.moe.eval_dispatcher={eval_dispatcher!r} is unknown; choose one of {DISPATCHER_NAMES}.")
    block_size = moe.get("block_size", DEFAULT_BLOCK_SIZE)
    _require(block_size > 0, f"model.moe.block_size={block_size} must be positive (rows per block of the "
                             f"grouped dispatcher; {DEFAULT_BLOCK_SIZE} by default).")
    for key, name in (("dispatcher", moe.dispatcher), ("eval_dispatcher", eval_dispatcher)):
      _require(name not in SINGLE_DEVICE_DISPATCHERS or config.mesh.expert == 1,
               f"model.moe.{key}={name!r} has no expert parallelism, but mesh.expert={config.mesh.expert}; "
               f"use --config.model.moe.{key}=auto (all_to_all over the expert axis) or --config.mesh.expert=1.")
    _require(config.mesh.expert > 0 and moe.num_experts % config.mesh.expert == 0,
             f"mesh.expert={config.mesh.expert} must divide model.moe.num_experts={moe.num_experts}; "
             f"set --config.mesh.expert to a divisor of {moe.num_experts}.")
    _check_routers(config)
  _require((moe.enabled and model.get("dense_match", "none") == "none") or config.mesh.expert == 1,
           f"mesh.expert={config.mesh.expert}, but a dense model has no experts to split over devices; "
           f"set --config.mesh.expert=1 (every device then takes a share of the batch).")
  _require(model.get("dense_match", "none") in DENSE_MATCHES,
           f"model.dense_match={model.get('dense_match')!r} is unknown; choose one of {DENSE_MATCHES}.")
  if task == "translation":
    _check_translation(config)


def _require_parses(parse, *args) -> None:
  """Runs a data module's own check; its ValueError (which names the fix) becomes a ConfigError."""
  try:
    parse(*args)
  except ValueError as error:
    raise ConfigError(str(error)) from None


def _check_translation(config) -> None:
  """What translation needs beyond the shared checks (tasks/translation.py)."""
  train, moe = config.train, config.model.moe
  corpus = config.data.get("corpus", "multi30k_bible")
  _require(corpus in ("multi30k_bible", "wmt", "files"),
           f"data.corpus={corpus!r} is unknown; choose multi30k_bible, wmt or files.")
  # Imported here: importing data/ loads the input pipeline.
  from stablemoe_jax.data import parallel_files, translation, wmt
  if corpus == "files":  # a user's own parallel files (configs/mt_files.py)
    _require_parses(parallel_files.check_config, config.data)
  if corpus == "wmt":
    _require_parses(wmt.parse_wmt_pairs, config.data.pairs)
  _require(config.data.get("sampling_temperature", 1.0) > 0,
           f"data.sampling_temperature={config.data.get('sampling_temperature')} must be > 0 (1: proportional).")
  _require_parses(translation.length_buckets, config.data.get("length_buckets", 1), train.seq_len)
  _require(0.0 <= train.get("label_smoothing", 0.0) < 1.0,
           f"train.label_smoothing={train.get('label_smoothing')} must lie in [0, 1).")
  _require(config.eval.get("max_sentences", 0) >= 0,
           f"eval.max_sentences={config.eval.get('max_sentences')} must be >= 0 (0: every sentence).")
  decode = config.get("decode")
  if decode is not None:
    _require(decode.beam_size >= 1, f"decode.beam_size={decode.beam_size} must be >= 1 (1: greedy search).")
    _require(0 <= decode.max_len <= config.model.max_len,
             f"decode.max_len={decode.max_len} must lie in [0, model.max_len={config.model.max_len}] "
             f"(0: model.max_len).")
    _require(decode.batch_size > 0, f"decode.batch_size={decode.batch_size} must be positive.")
    _require(decode.length_penalty >= 0, f"decode.length_penalty={decode.length_penalty} must be >= 0.")
  _require(train.get("schedule", "linear") in SCHEDULES,
           f"train.schedule={train.get('schedule')!r} is unknown; choose one of {SCHEDULES}.")
  # A decode step sees one position; only a router of the token id alone routes it as the whole sequence did.
  _require(moe.get("distilled_router") is None or moe.distilled_router.kind == "embedding",
           f"model.moe.distilled_router.kind={moe.distilled_router.kind!r}: translation decodes one position at "
           f"a time, so its distilled router must be 'embedding' (the token id alone).")


def check_backend(config, backend: str) -> None:
  """Raises ConfigError if the config cannot run on JAX backend ``backend`` ("cpu", "gpu", "tpu").

  Separate from :func:`validate_config`, which cannot know the machine: call it where the model is built.
  """
  try:
    attention_implementation(config.model, backend)
  except ValueError as error:
    raise ConfigError(str(error)) from None


def _differences(section, defaults: dict) -> list[tuple[str, object]]:
  return [(key, section[key]) for key in sorted(section.keys()) if key not in defaults or section[key] != defaults[key]]


def _check_routers(config) -> None:
  """The chosen router's own settings, and no changed setting of a router that is not chosen."""
  moe, train = config.model.moe, config.train
  entry = ROUTERS[moe.router]
  settings = moe[moe.router]
  for problem in entry.check(settings, moe):
    raise ConfigError(problem)
  for name in sorted(ROUTERS):
    if name == moe.router or moe.get(name) is None:
      continue
    for key, value in _differences(moe[name], ROUTERS[name].defaults):
      if key in ROUTERS[name].preset_keys:
        continue
      raise ConfigError(
          f"model.moe.{name}.{key}={value!r} is a setting of router {name!r}, but model.moe.router={moe.router!r} "
          f"would ignore it; choose that router with --config.model.moe.router={name}, or drop the "
          f"--config.model.moe.{name}.{key} override.")
  distilled = moe.get("distilled_router")
  if distilled is not None and entry.uses_distilled_router(settings):
    _require(distilled.kind in DISTILLED_KINDS,
             f"model.moe.distilled_router.kind={distilled.kind!r} is unknown; choose one of {DISTILLED_KINDS}.")
    for key in ("dim", "kernel_size", "num_layers", "num_heads"):
      _require(distilled[key] > 0, f"model.moe.distilled_router.{key}={distilled[key]} must be positive.")
    _require(distilled.distill_weight >= 0,
             f"model.moe.distilled_router.distill_weight={distilled.distill_weight} must be >= 0.")
    _require(distilled.kind != "transformer" or distilled.dim % distilled.num_heads == 0,
             f"model.moe.distilled_router.dim={distilled.dim} must be divisible by "
             f"model.moe.distilled_router.num_heads={distilled.num_heads}.")
  if moe.router == "base":
    groups = int(moe.get("num_groups", 1) or 1)
    tokens = train.batch_size // train.microbatches * train.seq_len
    _require(tokens % (groups * moe.num_experts) == 0,
             f"router 'base' gives every expert exactly 1/N of a routing group, but a step's {tokens} tokens "
             f"(train.batch_size / train.microbatches x train.seq_len) are not divisible by model.moe.num_groups "
             f"({groups}) x model.moe.num_experts ({moe.num_experts}); change train.batch_size or train.seq_len.")


def _check_health(config) -> None:
  """The ``health`` section (optional: a config without it gets ``train.health.DEFAULTS``)."""
  section = config.get("health")
  if section is None:
    return
  for key in sorted(section.keys()):
    _require(key in health_lib.DEFAULTS,
             f"health.{key} is unknown; the health keys are {sorted(health_lib.DEFAULTS)} (configs/default.py).")
  get = lambda key: section.get(key, health_lib.DEFAULTS[key])
  for key in ("min_mean_gate", "max_low_gate_fraction", "min_load_balance"):
    _require(0.0 <= get(key) <= 1.0, f"health.{key}={get(key)} must lie in [0, 1]; the default is "
                                     f"--config.health.{key}={health_lib.DEFAULTS[key]}.")
  _require(get("patience") >= 1, f"health.patience={get('patience')} must be >= 1 (consecutive log windows of "
                                 f"train.log_every steps before a layer is flagged dead).")
  train = config.train
  _require(-1 <= get("after_step") < train.steps,
           f"health.after_step={get('after_step')} must lie in [-1, train.steps={train.steps}) (-1: the end of the "
           f"warmup, train.warmup_steps); set --config.health.after_step=-1.")
  _require(get("on_collapse") in health_lib.ON_COLLAPSE,
           f"health.on_collapse={get('on_collapse')!r} is unknown; choose one of {health_lib.ON_COLLAPSE} "
           f"(warn: print once and train on, stop: end the run with an error).")

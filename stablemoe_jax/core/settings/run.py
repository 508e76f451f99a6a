"""The sections of a run besides the model: ``train``, ``eval``, ``mesh``, ``health``, ``analysis`` (and
translation's ``decode``), as frozen dataclasses. The defaults are the CPU default's (configs/default.py is built
from them); the translation-only keys (``carried`` by translation presets only) default to configs/mt_cpu.py's
meaning of an absent key. The checks: ``experiment/config_validation.py`` (train, eval), ``train/health.py``,
``analysis/recorder.py``."""
from __future__ import annotations

import dataclasses

from stablemoe_jax.core.settings.routers import setting

_TRANSLATION = ("translation",)  # ``carried``: the keys only a translation preset holds


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """``train``: the steps, the batches, the optimizer and the logging / checkpoint cadence."""

  steps: int = setting(850, "optimizer steps")
  stage1_steps: int = setting(300, "StableMoE's stage 1: the steps the router learns and is distilled; the CPU "
                                   "default's 300: 35% of training (the paper: 10% of 60K steps), the length the "
                                   "headline's seeds trained at, ending 100 steps before the warmup does, after 614K "
                                   "tokens (the other lengths measured: docs/results.md, Table 6)")
  batch_size: int = setting(16, "rows per step")
  microbatches: int = setting(1, ">1: accumulate gradients over batch_size / microbatches rows at a time")
  seq_len: int = setting(128, "positions per row (translation: source and target each)")
  learning_rate: float = setting(6e-3, "peak learning rate; the CPU default's 6e-3 and warmup 400 were chosen on "
                                       "seed-0 validation over lr {1e-3 .. 8e-3} x warmup {40, 400, 600} "
                                       "(configs/tune_cpu.py, results/tune_h100) among the settings whose layer is "
                                       "alive by the health verdict (docs/tuning.md)")
  warmup_steps: int = setting(400, "linear warmup steps")
  adam_b1: float = setting(0.9, "Adam beta1")
  adam_b2: float = setting(0.98, "Adam beta2")
  adam_eps: float = setting(1e-8, "Adam epsilon")
  clip_norm: float = setting(0.1, "global gradient-norm clip")
  router_lr_scale: float = setting(1.0, "the learned routers' own parameters (centroids; the cosine router's "
                                        "projection and temperature): their lr is the schedule's x this (1: the "
                                        "shared optimizer, the paper)")
  router_warmup_steps: int = setting(0, "the routers' lr x min(1, step / this); 0: no router warmup")
  log_every: int = setting(50, "steps per logged window")
  eval_every: int = setting(425, "steps between in-training evaluations")
  eval_batches: int = setting(20, "validation batches per in-training evaluation; <= 0: whole split")
  checkpoint_every: int = setting(200, "steps between checkpoints")
  keep_checkpoints: int = setting(3, "checkpoints kept")
  schedule: str = setting("linear", "linear (warmup then linear decay) | inverse_sqrt (translation)",
                          carried=_TRANSLATION)
  label_smoothing: float = setting(0.0, "translation: label smoothing of the loss", carried=_TRANSLATION)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """``eval``: the final and ``--mode=eval`` evaluations."""

  batch_size: int = setting(32, "rows per evaluation batch")
  seq_len: int = setting(128, "positions per row")
  stride: int = setting(0, "0 (or seq_len): non-overlapping blocks, mean context ~seq_len / 2; 0 < "
                           "stride < seq_len: sliding windows advancing by stride, each token scored once with >= "
                           "seq_len - stride tokens of context")
  max_batches: int = setting(0, "> 0: the final and --mode=eval evaluations score only each split's first "
                                "N batches (quick checks; the summary says so under \"eval\"); 0: the whole "
                                "split, as every reported result")
  max_sentences: int = setting(0, "translation: > 0: only each evaluation set's first N sentences (quick "
                                  "checks); 0: all", carried=_TRANSLATION)


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  """``mesh``: the device mesh (data, expert); data = devices / expert."""

  expert: int = setting(1, "devices sharing the experts (E / expert each); must divide E and the device count")


@dataclasses.dataclass(frozen=True)
class HealthSettings:
  """``health``: the router health verdict and the training guard (docs/router_health.md)."""

  min_contribution: float = setting(0.01, "dead: removing the layer costs less than this share of valid PPL")
  max_top2_load: float = setting(0.9, "dead: its two busiest experts (of N > 2) take more than this share")
  min_gate_position: float = setting(0.05, "warning: mean gate this close to the floor of its attainable range")
  min_load_balance: float = setting(0.5, "warning: load entropy / ln N below this")
  patience: int = setting(2, "consecutive log windows for the load rules")
  after_step: int = setting(-1, "only windows and evaluations after this step count; -1: train.warmup_steps")
  on_collapse: str = setting("warn", "warn: print once and train on | stop: stop with an error (exit status 2)")
  contribution_batches: int = setting(20, "validation batches of the final contribution measure; <= 0: all")


@dataclasses.dataclass(frozen=True)
class AnalysisSettings:
  """``analysis``: the routing records, fluctuation and cohesion (README "Routing analysis")."""

  record_every: int = setting(25, "record the routing of a fixed validation sample every N steps; 0: never")
  sample_tokens: int = setting(4096, "that sample: the validation split's first tokens, in rows of train.seq_len")
  top_tokens: int = setting(10, "cohesion table: the most frequent tokens listed per expert")
  report_at_end: bool = setting(True, "after training, write cohesion, load and fluctuation to workdir/analysis")


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """``decode`` (translation): BLEU at the end of training, ``--mode=eval``, ``--mode=translate``."""

  beam_size: int = setting(5, "beam width; 1: greedy search")
  length_penalty: float = setting(1.0, "a finished hypothesis scores logprob_sum / length**a (fairseq's lenpen)")
  max_len: int = setting(0, "generated tokens (eos included); 0: model.max_len")
  batch_size: int = setting(64, "sentences decoded together")
  sets: str = setting("all", "the final BLEU on every test set; primary: each pair's table column only")

"""``--mode=analyze``: restore a checkpoint and write the run's analysis files (see ``report``)."""
from __future__ import annotations

import pathlib

import ml_collections

from stablemoe_jax.analysis.report import write_report
from stablemoe_jax.config_validation import ConfigError
from stablemoe_jax.models.transformer import has_moe_layers
from stablemoe_jax.train import loop


def analyze_checkpoint(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       step: int | None = None, split: str = "valid") -> dict:
  """Restores the checkpoint at ``step`` (default: latest) and writes cohesion and load statistics for ``split``,
  plus the fluctuation summary and plot of the run's routing records, into ``workdir/analysis``."""
  if not has_moe_layers(config.model):
    raise ConfigError("this is a dense model (model.moe.enabled=False or model.dense_match set): it has no routing "
                      "to analyse; "
                      "use the config the run was trained with.")
  exp = loop.Experiment(config, workdir)
  try:
    step, state = exp.restore_for_evaluation(step)
    return write_report(exp, state.params, split, step)
  finally:
    exp.checkpointer.close()

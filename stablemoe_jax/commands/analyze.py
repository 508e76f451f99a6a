"""``--mode=analyze``: restore a checkpoint and write the run's analysis files (see ``report``)."""
from __future__ import annotations

import json
import pathlib

import jax
import ml_collections

from stablemoe_jax.analysis.contribution import experiment_contributions
from stablemoe_jax.analysis.report import write_report
from stablemoe_jax.core.errors import ConfigError
from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.experiment import loop
from stablemoe_jax.models.transformer import has_moe_layers


def analyze_checkpoint(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       step: int | None = None, split: str = "valid") -> dict:
  """Restores the checkpoint at ``step`` (default: latest) and writes cohesion and load statistics for ``split``,
  the fluctuation summary and plot of the run's routing records, and each MoE layer's contribution
  (``contribution_{split}_step{N}.json``: ``split``'s loss with that layer's expert outputs set to zero, on its
  first ``health.contribution_batches`` batches) into ``workdir/analysis``."""
  if not has_moe_layers(settings_lib.from_config(config).model):  # the command's edge: its config typed
    raise ConfigError("this is a dense model (model.moe.enabled=False or model.dense_match set): it has no routing "
                      "to analyse; "
                      "use the config the run was trained with.")
  loop.require_checkpoint(workdir, step)  # before anything is built or written
  exp = loop.Experiment(config, workdir)
  try:
    step, state = exp.restore_for_evaluation(step)
    result = write_report(exp.view(), state.params, split, step)
    contribution = experiment_contributions(exp.view(), state.params, split)
    if jax.process_index() == 0:
      path = pathlib.Path(result["analysis_dir"]) / f"contribution_{split}_step{step}.json"
      path.write_text(json.dumps(contribution, indent=2))
    return {**result, "contribution": contribution}
  finally:
    exp.checkpointer.close()

"""Routing records, the routing report and --mode=analyze for translation: encoder and decoder MoE layers,
a fixed sample of validation pairs, padding left out of every count."""
from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from tests.mt_fixtures import copy_shared_run

from stablemoe_jax.analysis import fluctuation, records
from stablemoe_jax.commands.analyze import analyze_checkpoint
from stablemoe_jax.experiment import loop
from stablemoe_jax.models.seq2seq import PAD_ID


def test_fluctuation_leaves_padding_out():
  steps = np.array([0, 10, 20])
  train = np.array([[[0, 1, 2, 3]], [[0, 1, 0, 3]], [[0, 1, 2, 1]]])  # [K=3, L=1, T=4]
  mask = np.array([[True, True, True, False]])  # token 3 is padding: its last fluctuation (step 10) is no token's
  rec = records.Records(steps=steps, train=train, inference=train, sample_tokens=np.arange(4), token_mask=mask,
                        meta={"layers": ["encoder_moe_1"], "stage1_steps": 20, "steps": 20})
  summary = fluctuation.summarize(rec)
  assert summary["real_tokens"] == {"encoder_moe_1": 3}
  assert summary["all_layers"]["after_20"] == pytest.approx(1 / 3)  # token 2 only (step 10); padding not counted
  assert summary["all_layers"]["last_fluctuation_step_max"] == 10
  x, y = fluctuation.curve_from_records(rec)
  np.testing.assert_allclose(y, [2 / 3, 1.0, 1.0])


@pytest.fixture(scope="module")
def mt_recorded(mt_shared_run, tmp_path_factory):
  """The shared tiny run (conftest.mt_shared_run: 12 steps, stage 2 from step 7, routing recorded every 2 steps
  of 8 validation pairs), copied: the test rewrites its analysis files."""
  config, _, workdir, summary = copy_shared_run(mt_shared_run, tmp_path_factory.mktemp("mt_analysis") / "compare")
  return config, workdir, summary


def _distilled_table(config, workdir, layer):
  exp = loop.Experiment(config, workdir)
  try:
    _, state = exp.restore_for_evaluation(None)
  finally:
    exp.checkpointer.close()
  distilled = jax.device_get(state.params[layer]["router"]["distilled_router"])
  return np.argmax(distilled["embedding"] @ distilled["centroids"].T, axis=-1), exp


@pytest.mark.slow
def test_translation_records_and_analyze_mode(mt_recorded):
  config, workdir, summary = mt_recorded
  loaded = records.load_records(workdir)
  layers = loaded.layers
  assert len(layers) == 2 and layers[0].startswith("decoder_moe_") and layers[1].startswith("encoder_moe_")
  assert loaded.steps.tolist() == list(range(0, 13, 2)) and loaded.train.shape == (7, 2, 8 * 32)
  # The sample: validation pairs of every language pair; the encoder routes sources, the decoder bos + target.
  source, target = loaded.sample_tokens.reshape(2, 8, 32)[::-1]
  np.testing.assert_array_equal(loaded.token_mask[1], (source != PAD_ID).ravel())
  assert (target[:, 0] == 2).all() and (loaded.token_mask[0] == (target != PAD_ID).ravel()).all()
  assert len(set(source[:, 0])) == 4  # the first token is the pair's tag: de, fr, cs, es all sampled
  # StableMoE stage 2: the training routing of every real token is the frozen table of its id.
  for i, layer in enumerate(layers):
    table, _ = _distilled_table(config, workdir, layer)
    real = loaded.token_mask[i]
    stage2 = loaded.train[loaded.steps >= config.train.stage1_steps, i][:, real]
    assert (stage2 == stage2[0]).all()
    np.testing.assert_array_equal(stage2[-1], table[loaded.sample_tokens.reshape(2, -1)[i][real]])
  flu = json.loads((workdir / "analysis" / "fluctuation.json").read_text())["train"]
  assert flu["real_tokens"] == {layer: int(loaded.token_mask[i].sum()) for i, layer in enumerate(layers)}
  assert flu["all_layers"]["fluctuating_in_stage2"] == 0.0 and set(flu["layers"]) == set(layers)
  assert set(summary["analysis"]["health"]) == set(layers)

  # --mode=analyze rewrites the end-of-run files identically; cohesion counts every real token, no padding.
  trained = {p.name: p.read_text() for p in (workdir / "analysis").iterdir() if p.suffix in (".json", ".md")}
  shutil.rmtree(workdir / "analysis")
  result = analyze_checkpoint(config, workdir, split="valid")
  assert set(result["health"]) == set(layers) and set(result["contribution"]["layers"]) == set(layers)
  for name, text in trained.items():
    assert (workdir / "analysis" / name).read_text() == text, name
  cohesion = json.loads(trained[f"cohesion_valid_step{config.train.steps}.json"])
  _, exp = _distilled_table(config, workdir, layers[0])
  batches = list(exp.task.eval_batches(exp.data, exp.settings, "valid"))
  real = {"encoder": sum(int((b["source"] != PAD_ID).sum()) for b in batches),
          "decoder": sum(int(b["weights"].sum()) for b in batches)}
  for layer in layers:
    assert sum(row["tokens"] for row in cohesion[layer]) == real[layer.split("_")[0]], layer

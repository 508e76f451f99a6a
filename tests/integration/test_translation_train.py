"""Translation through the shared loop: a short real-data run lowers the loss; stop and resume is exact."""
from __future__ import annotations

import json

import pytest
from tests.mt_fixtures import make_tiny_mt_config, write_small_corpora

from stablemoe_jax.commands import translate as translate_command
from stablemoe_jax.experiment import loop
from stablemoe_jax.train import health as health_lib


def _rows(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _task_losses(workdir) -> list[float]:
  return [row["task_loss"] for row in _rows(workdir) if "task_loss" in row]


@pytest.mark.slow
def test_training_lowers_the_loss_and_resumes_exactly(tmp_path):
  corpora = write_small_corpora(tmp_path / "corpora")
  config = make_tiny_mt_config(corpora)
  config.train.steps, config.train.stage1_steps = 40, 20
  # Packed rows (the comparison's), a checkpoint inside a log window (step 24 of 20-30) and one evaluation (15).
  config.data.pack_pairs, config.data.length_buckets = True, 1
  config.train.log_every, config.train.checkpoint_every, config.train.eval_every = 10, 8, 15
  whole = loop.train_and_evaluate(config, tmp_path / "whole")
  losses = _task_losses(tmp_path / "whole")
  assert losses[-1] < losses[0] - 0.5, losses
  assert set(whole.pair_weights) == {"de-en", "fr-en", "cs-en", "es-en"}
  # The scored tokens counted over training are the replayed batches' target tokens (eos included).
  batches = loop.Experiment(config, tmp_path / "whole").train_batches()
  per_step = [float(next(batches)["weights"].sum()) for _ in range(config.train.steps)]
  counted = {row["step"]: row["trained_tokens"] for row in _rows(tmp_path / "whole") if "trained_tokens" in row}
  assert counted[40] == sum(per_step) and counted[15] == sum(per_step[:15]) and counted[24] == sum(per_step[:24])
  # Two MoE layers: both removed at once is measured at the evaluation point and at the end, and the model judged
  # as a whole (issue 74).
  health = whole.health
  assert sorted(health["contribution"]["all_layers"]["layers"]) == ["decoder_moe_0", "encoder_moe_0"]
  assert health["model"]["judged_from"] == "all MoE layers removed at once" and "weak_in_training" in health
  assert [row["step"] for row in _rows(tmp_path / "whole") if health_lib.ALL_LAYERS_KEY in row] == [15, 30]

  (tmp_path / "resumed").mkdir()  # one tokenized corpus for both runs, as the comparison runner shares it
  (tmp_path / "resumed" / "data").symlink_to(tmp_path / "whole" / "data", target_is_directory=True)
  stopped = loop.train_and_evaluate(config, tmp_path / "resumed", stop_at_step=25)
  assert stopped == {"stopped_at_step": 25}  # killed after step 25: resumes from the checkpoint of step 24
  resumed = loop.train_and_evaluate(config, tmp_path / "resumed")
  assert resumed.valid == whole.valid and resumed.test == whole.test
  assert resumed.health == whole.health  # the guard rebuilt from the log, the all-layers measure included
  assert {row["step"]: row["trained_tokens"] for row in _rows(tmp_path / "resumed") if "trained_tokens" in row} == counted
  scores = lambda summary: {k: v for k, v in summary.bleu.items() if k != "sentences_per_second"}
  assert scores(resumed) == scores(whole) and set(whole.bleu["per_pair"]) == set(whole.pair_weights)

  source = tmp_path / "in.de"
  source.write_text("Ein Mann fährt Fahrrad.\n\nZwei Hunde spielen im Schnee.\n", encoding="utf-8")
  result = translate_command.translate_file(config, tmp_path / "whole", None, "fr", str(source),
                                            str(tmp_path / "out.en"))
  lines = (tmp_path / "out.en").read_text(encoding="utf-8").split("\n")
  assert result["sentences"] == 3 and len(lines) == 4 and lines[1] == "" and lines[3] == ""

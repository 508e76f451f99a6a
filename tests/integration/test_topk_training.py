"""A Switch top-2 run with a shared expert, end to end on PTB (slow)."""
import numpy as np
import pytest


@pytest.mark.slow
def test_switch_top2_with_a_shared_expert_trains_end_to_end(tiny_config, prepared_ptb, tmp_path):
  from tests.conftest import share_prepared_ptb
  from stablemoe_jax.experiment import loop
  share_prepared_ptb(prepared_ptb, tmp_path)
  tiny_config.model.moe.router, tiny_config.model.moe.switch.top_k = "switch", 2
  tiny_config.model.moe.shared_experts = 1
  tiny_config.train.steps, tiny_config.train.stage1_steps, tiny_config.train.eval_every = 8, 2, 100
  summary = loop.train_and_evaluate(tiny_config, tmp_path)
  assert np.isfinite(summary.test["perplexity"]) and summary.health["guard"]["top_k"] == 2
  from stablemoe_jax.train.metrics import read_metrics
  records = [r for r in read_metrics(tmp_path) if "loss" in r]
  assert records and all(np.isfinite(r["loss"]) for r in records)
  assert all(abs(sum(r["moe/moe_0/load"]) - 1) < 1e-5 for r in records)

"""The fact-memorization regime (issue 73): a tiny LM that must store more facts than its active parameters hold.

A synthetic corpus (``data.corpus=facts``, stablemoe_jax/data/lm/facts.py): 1,600 entities named by 40 x 40 shared
name pieces, 8 attributes each, every value one of 64: 12,800 facts of 6 bits, rendered ``<attr> <first> <last>
<value>``; lines reshuffled every epoch. Calibrated (docs/facts.md): at 4 attributes the dense model recalls 94%
of the facts by step 4,750; at 8 it recalls 20% while StableMoE recalls 98%. The model: 2 blocks of d 64 with one MoE layer of 8 experts after the first, StableMoE as
the default (its other routers and the dense baselines are one override away: docs/facts.md). Every evaluation
point records each fact's recall and the expert its value-predicting token goes to (``workdir/facts/``); the summary
reports recall, the value tokens' NLL, how many experts the facts use, and forgetting when routes change.

Run (StableMoE: 288 s of wall time on 2 quiet cores, evaluation included):
  python -m stablemoe_jax.main --config configs/facts_cpu.py --workdir runs/facts
The other layout: --config.data.facts.layout=name_first. A dense model of the MoE's total parameters:
--config.model.moe.enabled=False --config.model.dense_match=wider.
"""
import ml_collections

from configs import default
from stablemoe_jax.core import settings


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.data.corpus = "facts"
  config.data.facts = settings.config_dict(settings.FactsSettings)  # 40 x 40 name pieces, 1,600 entities, 64 values
  config.data.facts.attributes = 8  # 12,800 facts: past the dense model's reach in 5,000 steps (docs/facts.md)

  config.model.d_model = 64
  config.model.num_heads = 2
  config.model.num_layers = 2
  config.model.d_ff = 256
  config.model.max_len = 60
  config.model.dropout = 0.0  # memorisation: nothing to regularise against
  config.model.moe.sublayers_per_expert = 1  # one MoE layer of 8 experts, after block 1 of 2 ("middle")

  config.train.steps = 5000
  config.train.stage1_steps = 500  # the paper's 10%
  config.train.batch_size = 32
  config.train.seq_len = 60  # 12 lines of 5 tokens a row
  config.train.learning_rate = 3e-3
  config.train.warmup_steps = 200
  config.train.log_every = 100
  config.train.eval_every = 250  # every evaluation point records every fact's recall and route
  config.train.eval_batches = 0  # the whole corpus (12,800 lines, 67 batches)
  config.train.checkpoint_every = 1000
  config.eval.seq_len = 60
  config.eval.batch_size = 16
  config.health.contribution_batches = 0
  config.analysis.record_every = 250
  config.analysis.sample_tokens = 1920  # 32 rows of the validation lines
  return config

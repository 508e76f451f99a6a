"""The facts regime's comparison (issue 73, part 4) under the tuned rule: each method's learning rate chosen on seed 0
from the grid below, by validation perplexity over the facts (the corpus is the training facts: this regime measures
memorisation), seeds 1-3 at each choice reported with paired intervals against dense; recall, the value tokens' NLL,
the experts the facts use and forgetting by route change in the report's columns (docs/facts.md).

Run, one layout at a time (resumable; every finished run's small files go to the layout's results folder):
  python -m stablemoe_jax.compare --config configs/tune_facts_cpu.py --workdir runs/tune_facts
  python -m stablemoe_jax.compare --config configs/tune_facts_cpu.py:name_first --workdir runs/tune_facts_name_first
Report what has finished without training: add --config.compare.report_only=True.

Tuned: train.learning_rate over {3e-3, 1e-2} (warmup 200). Not tuned, shared by every method: configs/facts_cpu.py's
model, corpus and 5,000-step budget, StableMoE's stage 1 of 500 steps and its router settings (the CPU default's:
balance loss over all tokens, cosine routing), every router's other settings at their defaults.
"""
import ml_collections

from configs import compare_cpu, facts_cpu

# The first layout puts a name piece before the value, where routers of the token alone (StableMoE's distilled router,
# Hash) can spread the facts; the second puts the attribute there, which only routers of the hidden state can.
METHODS = {"attribute_first": "dense,dense_wider,dense_flops,stablemoe,switch,switch_top2,base,hash,deepseek",
           "name_first": "dense,stablemoe,switch,hash"}


def get_config(layout: str = "attribute_first") -> ml_collections.ConfigDict:
  if layout not in METHODS:
    raise ValueError(f"configs/tune_facts_cpu.py:{layout}: the layout is attribute_first or name_first.")
  config = facts_cpu.get_config()
  config.data.facts.layout = layout
  config.compare = compare_cpu.get_config().compare
  config.compare.methods = METHODS[layout]
  config.compare.seeds = 3
  config.compare.grid.learning_rate = "3e-3,1e-2"
  config.compare.grid.warmup_steps = "200"
  config.compare.results_dir = f"results/facts_cpu/{layout}"
  return config

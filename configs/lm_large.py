"""The paper's large LM: 24 blocks, d=1024, 64 experts of 6 sublayers, lr 3e-4, 60K steps (6K stage 1).

Data, batch, routing groups and sample as configs/lm_base.py: a corpus prepared by ``python -m
stablemoe_jax.prepare --config configs/lm_large.py --workdir W --config.data.train_files=...`` (its docstring),
never Penn Treebank unless asked. The experts are split over 8 devices (``mesh.expert=8``), so it launches on 8, 16,
..., 64 devices; on fewer, the config check says so in one line (``--config.mesh.expert`` to a divisor of them).
"""
from configs import lm_base


def get_config():
  config = lm_base.get_config()
  config.model.d_model = 1024
  config.model.num_heads = 16
  config.model.num_layers = 24
  config.model.d_ff = 4096
  config.model.moe.num_experts = 64
  config.model.moe.sublayers_per_expert = 6
  config.train.learning_rate = 3e-4
  # 3.2B expert parameters: split the 64 experts over the 8 GPUs of a node (8 each); data takes the other devices.
  config.mesh.expert = 8
  return config

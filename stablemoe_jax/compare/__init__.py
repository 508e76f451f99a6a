"""The paper's comparison (Table 3, Figure 5) by one command: ``python -m stablemoe_jax.compare``.

methods.py: the named methods (config-override sets) and their validation; runner.py: one
train-and-evaluate run per method and seed, resumable; report.py: comparison.{md,json} and
convergence.png; sweep.py: the tuned comparison (a grid per method, the choice, seeds at it) and sweep_report.py its
report.
"""

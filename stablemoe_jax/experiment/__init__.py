"""What runs an experiment, above the tasks: the pure train and eval steps (step.py), the whole-config check
(config_validation.py), the loop (loop.py: ``Experiment``, train, eval) and ``--mode=plan`` (plan.py)."""

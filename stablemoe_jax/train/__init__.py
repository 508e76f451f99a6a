"""What a train step is made of: losses, schedules, the stage-aware optimizer, the state, checkpoints, health and
metrics (the steps and the loop that use them are in ``stablemoe_jax/experiment/``)."""

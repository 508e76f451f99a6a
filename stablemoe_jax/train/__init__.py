"""Train state, the stage-aware optimizer, the pure train/eval steps, checkpoints and the loop."""

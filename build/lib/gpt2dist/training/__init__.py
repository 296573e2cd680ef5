"""Training: the model, the one training loop, precisions, checkpoints, metrics and one strategy per module.
May import system, data, pipeline, config and the shared ground; never launch or results."""

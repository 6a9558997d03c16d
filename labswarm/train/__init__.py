"""Training on the feature store: models, the trainer, checkpoints."""

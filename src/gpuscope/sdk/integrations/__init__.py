"""Framework integrations: a few lines in the user's trainer, next to W&B or MLflow loggers."""

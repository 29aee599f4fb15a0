"""What runs: the `bertpipe` CLI, the pre-training trainer, the fine-tuning runner, Ray sweeps."""

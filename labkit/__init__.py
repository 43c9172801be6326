"""labkit: train a small model on GSM8K with GRPO, and see what the group size does."""

__version__ = "0.1.0"

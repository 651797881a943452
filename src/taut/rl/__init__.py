"""GRPO-family RL: advantages, losses and the training loop."""

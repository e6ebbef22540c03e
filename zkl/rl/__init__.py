"""The shared GRPO training loop and its parts (task, advantages, loss, policy update)."""

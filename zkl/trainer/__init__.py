"""The trainer: the policy model and its optimizer, the train path's logprobs (scoring), the
GRPO update, and the weights a refit sends. The loop (zkl/rl/loop.py) asks it to score a
rollout, to update on it, and for its refit state, once each per step."""

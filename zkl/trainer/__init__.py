"""The trainer: the policy model and its optimizer, the train path's logprobs (scoring), the
padded batches scoring and the update both read, the update on the loss the algorithm gives it
(zkl/rl/loss.py), and the weights a refit sends. The loop (zkl/rl/loop.py) asks it to score a
rollout, to update on it, and for its refit state, once each per step."""

"""zkl: zero train/generation mismatch for on-policy RL of LLMs."""

__version__ = "0.1.0"

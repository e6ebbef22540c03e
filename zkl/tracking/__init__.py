"""Experiment tracking helpers (W&B offline-run reading)."""

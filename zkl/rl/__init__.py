"""The one GRPO loop every engine and layout runs, and the algorithm it runs: advantages, the
clipped policy-gradient loss the trainer is given, the mismatch corrections, the metrics row,
validation on held-out problems."""

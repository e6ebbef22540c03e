"""The tasks a run learns from: the built-in add and residue tasks, and your own data (an HF
tokenizer, local dataset files, and the rewards that score them)."""

"""Your own data: an HF tokenizer, local dataset files, and the rewards that score them."""

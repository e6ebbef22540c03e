"""Where the generator runs relative to the trainer, and how weights reach it (`generator`)."""

"""What a run records: metrics.jsonl and token records (the source of truth), its W&B run,
and reading an offline W&B run back."""

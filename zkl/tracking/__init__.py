"""What a run records: metrics.jsonl and token records (the source of truth), and its W&B
run."""

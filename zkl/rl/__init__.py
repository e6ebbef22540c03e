"""The one GRPO loop every backend and layout runs, with its advantages, validation and the
mismatch metrics that compare the generator's logprobs with the trainer's."""

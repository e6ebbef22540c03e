"""Tests of zkl/megatron/."""

import torch

from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request


def mixed_length_requests(vocab: int, max_new_tokens: int) -> list[Request]:
    """Six seeded prompts of 3 to 19 tokens below `vocab`: chunked prefill, padded rows and
    continuous batching in one `generate`."""
    g = torch.Generator().manual_seed(1)
    return [
        Request(
            i,
            torch.randint(2, vocab, (int(n),), generator=g).tolist(),
            SamplingParams(max_new_tokens=max_new_tokens, seed=i),
        )
        for i, n in enumerate(torch.randint(3, 20, (6,), generator=g))
    ]

"""What every benchmark runs: the two modes it compares and its fixed, seeded requests."""

from __future__ import annotations

import torch

from zkl import invariance
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request

MODES = {"zero": frozenset(invariance.FIXES), "default": frozenset()}
PROMPT_LEN = 128
NEW_TOKENS = 128
TRAIN_SEQS, TRAIN_LEN = 16, 512  # the train step: 8192 tokens a forward + backward


def bench_requests(batch: int, vocab: int, seed: int = 0) -> list[Request]:
    """`batch` requests of PROMPT_LEN random tokens, each producing exactly NEW_TOKENS."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (batch, PROMPT_LEN), generator=g).tolist()
    params = [SamplingParams(max_new_tokens=NEW_TOKENS, seed=i) for i in range(batch)]
    return [Request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]

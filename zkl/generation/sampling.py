"""Seeded sampling: each request owns a generator, so its samples never depend on neighbours."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 16
    seed: int = 0


def processed_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [V] -> fp32 logits / temperature with top-k / top-p filtered to -inf."""
    out = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(out, min(params.top_k, out.shape[-1])).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = out.sort(descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the token that crosses top_p
        out = out.clone()
        out[order[drop]] = float("-inf")
    return out


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Draw one token from logits [V] with the request's own generator."""
    probs = torch.softmax(processed_logits(logits, params), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())

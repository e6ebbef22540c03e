"""Sampling on the device, vectorized over the batch, with a counter-based generator.

A request's draw at its n-th generated token is a pure function of (its seed, n, its
logits): Gumbel-max over `filtered logits / T + Gumbel(hash(seed, n, vocab id))`. No row ever
reads another row's values and there is no generator state, so the decode loop samples the
whole batch in a few kernels, without Python per row and without a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zkl import ops


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 16
    seed: int = 0


def scaled_logits(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> fp32 logits / temperature [B]: the raw distribution softmax(logits / T)
    every reported logprob and every mismatch metric is of, filtered or not."""
    return logits.float() / temperature.unsqueeze(-1)


def filtered(
    scaled: torch.Tensor, top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None
) -> torch.Tensor:
    """Scaled logits [B, V] with each row's top-k [B] / top-p [B] cut set to -inf: the
    distribution a token is drawn from (`scaled` itself when both are None).

    `top_k` 0 and `top_p` 1 leave a row unfiltered; pass None when no row filters (the
    caller knows from the requests, so no device value is read).
    """
    if top_k is None and top_p is None:
        return scaled
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
        kth = sorted_logits.gather(-1, (k - 1).unsqueeze(-1))
        drop |= sorted_logits < kth
    if top_p is not None:
        kept = sorted_logits.masked_fill(drop, float("-inf"))
        probs = torch.softmax(kept, dim=-1)
        # keep the token that crosses top_p
        drop |= (probs.cumsum(-1) - probs > top_p.unsqueeze(-1)) & (top_p < 1).unsqueeze(-1)
    return scaled.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def processed_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits [B, V] -> fp32 logits / temperature [B] with top-k [B] / top-p [B] set to -inf."""
    return filtered(scaled_logits(logits, temperature), top_k, top_p)


def gumbel_max(
    scores: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor | None = None,
) -> torch.Tensor:
    """argmax of scores [B, V] (`filtered` logits / T) + Gumbel noise keyed by each row's
    (seed, token index) and the vocab id: the next token [B] (int64). With `temperature`,
    `scores` are the raw logits of unfiltered rows, divided as `scaled_logits` divides (same
    bits)."""
    device = scores.device
    return ops.gumbel_argmax(scores, seeds.to(device), counters.to(device), temperature)


def sample(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Next token [B] (int64, on the logits' device) of every row: Gumbel-max sampling."""
    return gumbel_max(processed_logits(logits, temperature, top_k, top_p), seeds, counters)

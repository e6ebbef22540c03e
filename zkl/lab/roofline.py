"""The memory roofline of a decode step: the bytes it must move over the device's copy
bandwidth."""

from __future__ import annotations

import torch

from zkl.lab.timing import cuda_time


def copy_bandwidth() -> float:
    """Bytes/s of a device-to-device copy of 2 GiB (read + write counted)."""
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_time(lambda: dst.copy_(src), repeats=10, warmup=2)
    return 2 * src.numel() * src.element_size() / seconds


def moe_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE blocks (those with a router and experts), in layer order."""
    return [m for m in model.modules() if hasattr(m, "route") and hasattr(m, "experts")]


def decode_bytes(
    model: torch.nn.Module, batch: int, mean_keys: float, experts_read: list[int] | None = None
) -> float:
    """Bytes one decode step must move: every weight but the embedding's gathered rows, once,
    plus each row's cached K/V up to its position and the new K/V it writes. For an MoE model
    `experts_read` (per MoE layer, the distinct experts the step routes to) replaces each
    layer's experts by those it reads."""
    cfg = model.cfg
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if experts_read is not None:
        for layer, read in zip(moe_layers(model), experts_read, strict=True):
            per_expert = sum(p.numel() * p.element_size() for p in layer.experts[0].parameters())
            weights -= (len(layer.experts) - read) * per_expert
    if not cfg.tie_word_embeddings:  # the embedding table is only gathered, a row per token
        weights -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    per_token_kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    per_token_kv *= model.embed_tokens.weight.element_size()
    return weights + batch * (mean_keys + 1) * per_token_kv

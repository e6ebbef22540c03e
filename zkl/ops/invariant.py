"""Batch-invariant CPU reference kernels: a row's result never depends on its neighbours.

Each kernel is built from pieces whose per-element result is fixed by construction:
elementwise ops (correctly rounded, lane-independent), GEMMs on tiles of a fixed row count
(the kernel choice then never changes with the batch), and sums written as a fixed pairwise
tree of elementwise adds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

GEMM_ROWS = 16  # every GEMM call sees exactly this many rows
KV_BLOCK = 16  # attention walks keys in blocks of this size from position 0


def mm_fixed_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x @ weight.T` for x [M, K], weight [N, K], run as ceil(M/16) calls of exactly 16 rows."""
    num_rows = x.shape[0]
    pad = (-num_rows) % GEMM_ROWS
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    w_t = weight.t()
    tiles = [torch.mm(tile, w_t) for tile in x.split(GEMM_ROWS)]
    out = torch.cat(tiles) if len(tiles) > 1 else tiles[0]
    return out[:num_rows]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = mm_fixed_rows(x.reshape(-1, x.shape[-1]), weight)
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias


def grouped_linear(
    x: torch.Tensor, weights: Sequence[torch.Tensor], offsets: torch.Tensor
) -> torch.Tensor:
    """Group e (rows offsets[e]:offsets[e + 1]) through `linear` with weights[e]: each row is
    the dense GEMM's row. A host loop: reading the offsets costs the CPU nothing."""
    return grouped_by_host_loop(linear, x, weights, offsets)


def grouped_by_host_loop(
    linear_fn: Callable, x: torch.Tensor, weights: Sequence[torch.Tensor], offsets: torch.Tensor
) -> torch.Tensor:
    """`linear_fn(group rows, weights[e], None)` for each non-empty group, in order."""
    bounds = offsets.tolist()
    parts = [
        linear_fn(x[lo:hi], w, None)
        for w, lo, hi in zip(weights, bounds[:-1], bounds[1:])
        if hi > lo
    ]
    return torch.cat(parts) if parts else x.new_empty(0, weights[0].shape[0])


def ordered_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over `dim` as a fixed pairwise tree (zero-padded to a power of two)."""
    x = x.movedim(dim, -1)
    size = x.shape[-1]
    width = 1 << max(size - 1, 0).bit_length()
    if width != size:
        x = torch.cat([x, x.new_zeros(*x.shape[:-1], width - size)], dim=-1)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    mean_sq = ordered_sum(xf * xf) / x.shape[-1]
    out = xf * torch.rsqrt(mean_sq + eps).unsqueeze(-1)
    return (out * weight.float()).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)): the add, then the invariant norm."""
    total = x + delta
    return total, rms_norm(total, weight, eps)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention, one kernel for prefill, decode and scoring.

    q [B, H, Tq, D]; k, v [R, Hkv, Tk, D] where key j sits at position j; q_pos [B, Tq];
    batch row b reads the keys of row `kv_rows[b]` (default b); `window` W > 0: a query at
    p sees only the keys p-W+1..p (sliding window).
    Keys are visited in blocks of 16 from position 0 with an fp32 online softmax; a block
    with no visible key leaves the state untouched, so the number of blocks a batch needs
    never changes a row's result (and blocks before every query's window are skipped).
    `sinks` [H] (gpt-oss) are one more logit per head with no value, folded into the state
    once, after the last block (`fold_sink`).
    """
    if kv_rows is not None:
        k, v = k[kv_rows], v[kv_rows]
    batch, num_heads, num_q, head_dim = q.shape
    groups = num_heads // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    num_keys = int(q_pos.max().item()) + 1
    num_blocks = math.ceil(num_keys / KV_BLOCK)
    padded = num_blocks * KV_BLOCK
    k = k[:, :, :padded].float()
    v = v[:, :, :padded].float()
    if k.shape[2] < padded:
        fill = padded - k.shape[2]
        k = torch.cat([k, k.new_zeros(batch, num_heads, fill, head_dim)], dim=2)
        v = torch.cat([v, v.new_zeros(batch, num_heads, fill, head_dim)], dim=2)
    qf = q.float() * (1.0 / math.sqrt(head_dim))
    m = qf.new_full((batch, num_heads, num_q), -math.inf)
    denom = qf.new_zeros(batch, num_heads, num_q)
    acc = qf.new_zeros(batch, num_heads, num_q, head_dim)
    offsets = torch.arange(KV_BLOCK, device=q.device)
    first = max(0, int(q_pos.min().item()) - window + 1) // KV_BLOCK if window else 0
    for block in range(first, num_blocks):
        lo = block * KV_BLOCK
        kb = k[:, :, lo : lo + KV_BLOCK]  # [B, H, 16, D]
        vb = v[:, :, lo : lo + KV_BLOCK]
        scores = ordered_sum(qf.unsqueeze(3) * kb.unsqueeze(2))  # [B, H, Tq, 16]
        visible = (lo + offsets) <= q_pos.unsqueeze(-1)  # [B, Tq, 16]
        if window:
            visible &= (lo + offsets) > q_pos.unsqueeze(-1) - window
        visible = visible.unsqueeze(1)
        scores = scores.masked_fill(~visible, -math.inf)
        m_new = torch.maximum(m, scores.amax(-1))
        any_visible = visible.any(-1)  # [B, 1, Tq]
        m_safe = torch.where(any_visible, m_new, torch.zeros_like(m_new))
        alpha = torch.exp(m - m_safe)
        p = torch.exp(scores - m_safe.unsqueeze(-1))  # [B, H, Tq, 16]
        pv = ordered_sum(p.unsqueeze(-1) * vb.unsqueeze(2), dim=-2)  # [B, H, Tq, D]
        denom = torch.where(any_visible, denom * alpha + ordered_sum(p), denom)
        acc = torch.where(any_visible.unsqueeze(-1), acc * alpha.unsqueeze(-1) + pv, acc)
        m = torch.where(any_visible, m_new, m)
    if sinks is not None:
        m, denom, acc = fold_sink(m, denom, acc, sinks.float().view(1, -1, 1))
    return (acc / denom.unsqueeze(-1)).to(q.dtype)


def fold_sink(
    m: torch.Tensor, denom: torch.Tensor, acc: torch.Tensor, sink: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An online-softmax state (max m, sum denom [B, H, Tq], output acc [..., D]) with one more
    logit `sink` whose value is zero: it takes probability mass and adds nothing. A query that
    saw no key gets sum 1 and output 0."""
    m_new = torch.maximum(m, sink)
    scale = torch.exp(m - m_new)
    return m_new, denom * scale + torch.exp(sink - m_new), acc * scale.unsqueeze(-1)

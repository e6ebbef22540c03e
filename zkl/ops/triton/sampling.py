"""Gumbel-max sampling in one pass over the scores: hash, noise, add and argmax fused.

Why: in torch ops (`zkl.ops.fast.gumbel_argmax` over `zkl.rng.gumbel`) the noise of a
[B, V] batch takes some forty int64 tensor passes (the 32-bit hash emulated without
overflow), about 8 GB of traffic a decode step at batch 64 on a 152k vocab, more than the
model's weights. Here each element's hash is computed in registers with wrapping uint32
arithmetic (the same bits as `zkl.rng.bits`), turned into the same fp32 uniform, and the
noisy score is reduced to its first argmax on the fly. Each row's result depends only on
its own scores and keys. The two logs are Triton's, so a draw may differ from the torch
path's in a near tie (the GPU test checks they agree on a full-vocab batch); every run of
this kernel agrees with itself.

The vocab is cut in `SPLITS` fixed parts per row (a function of V only), each part's first
maximum is kept, and the earliest part holding the row's maximum wins: `torch.argmax`'s
first-index rule.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
SPLITS = 16
GOLDEN = 0x9E3779B9


@triton.jit
def _mix32(x):
    """`zkl.rng.mix32` on uint32 (the multiplies wrap mod 2^32, shifts are logical)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _gumbel_argmax_kernel(
    scores_ptr,
    keys_ptr,
    best_ptr,
    index_ptr,
    vocab,
    per_split,
    stride_row,
    SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
    GOLDEN: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    key = tl.load(keys_ptr + row).to(tl.uint32)
    base = scores_ptr + row.to(tl.int64) * stride_row
    lo = part * per_split
    hi = tl.minimum(lo + per_split, vocab)
    best = tl.full((), float("-inf"), tl.float32)
    best_at = lo.to(tl.int32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        valid = offs < hi
        h = _mix32(_mix32(key ^ offs.to(tl.uint32)) ^ GOLDEN)  # offs < 2^32: high word 0
        u = ((h >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08  # 2^-24, exact
        noise = -tl.log(-tl.log(u))
        s = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32)
        noisy = tl.where(valid, s + noise, float("-inf"))
        m = tl.max(noisy, axis=0)
        at = tl.argmax(noisy, axis=0, tie_break_left=True)
        better = m > best
        best_at = tl.where(better, start + at, best_at)
        best = tl.where(better, m, best)
    tl.store(best_ptr + row * SPLITS + part, best)
    tl.store(index_ptr + row * SPLITS + part, best_at)


def gumbel_argmax(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """argmax(scores [B, V] + Gumbel noise of `keys` [B]) -> int64 [B], in one fused pass."""
    batch, vocab = scores.shape
    if batch == 0:
        return torch.empty(0, dtype=torch.int64, device=scores.device)
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    keys = keys.to(torch.int64).contiguous()  # read as keys[row]: a broadcast view is not
    per_split = triton.cdiv(triton.cdiv(vocab, SPLITS), BLOCK) * BLOCK
    best = torch.empty(batch, SPLITS, dtype=torch.float32, device=scores.device)
    index = torch.empty(batch, SPLITS, dtype=torch.int32, device=scores.device)
    _gumbel_argmax_kernel[(batch, SPLITS)](
        scores,
        keys,
        best,
        index,
        vocab,
        per_split,
        scores.stride(0),
        SPLITS=SPLITS,
        BLOCK=BLOCK,
        GOLDEN=GOLDEN,
    )
    winner = best.argmax(dim=-1, keepdim=True)  # the first part holding the maximum
    return index.gather(-1, winner).squeeze(-1).long()

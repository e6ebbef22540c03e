"""Gumbel-max sampling in one pass over the scores: key, hash, noise, add and argmax fused.

Why: in torch ops (`zkl.ops.fast.gumbel_argmax` over `zkl.rng.gumbel`) the noise of a
[B, V] batch takes some forty int64 tensor passes (the 32-bit hash emulated without
overflow), about 8 GB of traffic a decode step at batch 64 on a 152k vocab, more than the
model's weights, and the rows' keys a hundred tiny kernels. Here each row's key (as
`zkl.rng.key`) and each element's hash (as `zkl.rng.bits`) are computed in registers with
wrapping uint32 arithmetic, turned into the same fp32 uniform, and the noisy score is
reduced to its first argmax on the fly; given the temperature, the raw logits are divided
here too (no fp32 copy of the batch's logits). Each row's result depends only on its own
scores and keys. The two logs are Triton's, so a draw may differ from the torch path's in
a near tie (the GPU test checks they agree on a full-vocab batch); every run of this kernel
agrees with itself.

The vocab is cut in `SPLITS` fixed parts per row (a function of V only), each part's first
maximum is kept, and the earliest part holding the row's maximum wins: `torch.argmax`'s
first-index rule.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
SPLITS = 64  # parts of a row: any count gives the same token (first maximum)
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
def _fold(h, word, GOLDEN: tl.constexpr):
    """One 32-bit word into the hash: `zkl.rng.key`'s two mixes (the add wraps mod 2^32)."""
    h = _mix32(h ^ word)
    return _mix32(h + GOLDEN)


@triton.jit
def _request_key(seed, counter, GOLDEN: tl.constexpr):
    """`zkl.rng.key(seed, counter)` of non-negative int64s: each one's low word, then high."""
    h = tl.full((), GOLDEN, tl.uint32)
    h = _fold(h, seed.to(tl.uint32), GOLDEN)  # int64 -> uint32 keeps the low 32 bits
    h = _fold(h, (seed >> 32).to(tl.uint32), GOLDEN)
    h = _fold(h, counter.to(tl.uint32), GOLDEN)
    return _fold(h, (counter >> 32).to(tl.uint32), GOLDEN)


@triton.jit
def _gumbel_argmax_kernel(
    scores_ptr,
    seeds_ptr,
    counters_ptr,
    temp_ptr,
    best_ptr,
    index_ptr,
    vocab,
    per_split,
    stride_row,
    HAS_TEMP: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
    GOLDEN: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    seed = tl.load(seeds_ptr + row).to(tl.int64)
    counter = tl.load(counters_ptr + row).to(tl.int64)
    key = _request_key(seed, counter, GOLDEN)
    if HAS_TEMP:
        temp = tl.load(temp_ptr + row).to(tl.float32)
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
        if HAS_TEMP:  # torch's `logits.float() / temperature`: IEEE division, rounded
            s = tl.math.div_rn(s, temp)
        noisy = tl.where(valid, s + noise, float("-inf"))
        m = tl.max(noisy, axis=0)
        at = tl.argmax(noisy, axis=0, tie_break_left=True)
        better = m > best
        best_at = tl.where(better, start + at, best_at)
        best = tl.where(better, m, best)
    tl.store(best_ptr + row * SPLITS + part, best)
    tl.store(index_ptr + row * SPLITS + part, best_at)


def gumbel_argmax(
    scores: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor | None = None,
) -> torch.Tensor:
    """argmax(scores [B, V] (/ temperature [B]) + Gumbel noise keyed by `zkl.rng.key(seeds,
    counters)` [B]) -> int64 [B], in one fused pass: the key and the division too."""
    batch, vocab = scores.shape
    if batch == 0:
        return torch.empty(0, dtype=torch.int64, device=scores.device)
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    # read as t[row]: a broadcast view is not; no cast (int32 or int64 load alike)
    seeds, counters = seeds.expand(batch).contiguous(), counters.expand(batch).contiguous()
    temp = seeds if temperature is None else temperature.expand(batch).contiguous()
    per_split = triton.cdiv(triton.cdiv(vocab, SPLITS), BLOCK) * BLOCK
    best = torch.empty(batch, SPLITS, dtype=torch.float32, device=scores.device)
    index = torch.empty(batch, SPLITS, dtype=torch.int32, device=scores.device)
    _gumbel_argmax_kernel[(batch, SPLITS)](
        scores,
        seeds,
        counters,
        temp,
        best,
        index,
        vocab,
        per_split,
        scores.stride(0),
        HAS_TEMP=temperature is not None,
        SPLITS=SPLITS,
        BLOCK=BLOCK,
        GOLDEN=GOLDEN,
    )
    winner = best.argmax(dim=-1, keepdim=True)  # the first part holding the maximum
    return index.gather(-1, winner).squeeze(-1).long()

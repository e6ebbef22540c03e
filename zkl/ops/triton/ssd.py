"""The Mamba-2 chunk commit on the device: the state at a full chunk's end, written in place
for the rows whose chunk just filled, with no host read of which rows those are.

A decode step under `mamba_chunked_decode` commits a row's state only when its chunk fills.
Choosing those rows on the host (`full.any()`, then indexing) is a sync a CUDA graph cannot
hold; this kernel reads the row flags on the device instead, and programs of other rows
return at once. The arithmetic is the train path's (`zkl.ops.ssd.commit`), op for op: each
term (B[s] * to_end[s]) * xdt[s] rounded in fp32, the terms summed over the chunk's
positions as the same pairwise tree (zero-padded to a power of two), then decay * h + sum;
the exponentials come in from torch, and fp contraction is off, so the bits are the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _commit_kernel(
    state_ptr,  # fp32 [S, H, P, N], updated in place at rows slots[r] where full[r]
    slots_ptr,  # int64 [b]
    full_ptr,  # int8 [b]
    b_ptr,  # fp32 [b, Q, H, N]
    to_end_ptr,  # fp32 [b, Q, H]
    xdt_ptr,  # fp32 [b, Q, H, P]
    decay_ptr,  # fp32 [b, H]
    Q,
    H,
    P,
    N,
    QP: tl.constexpr,  # Q rounded up to a power of two
    LEVELS: tl.constexpr,  # log2(QP)
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    p0 = tl.program_id(2) * BLOCK_P
    if tl.load(full_ptr + row) == 0:
        return
    slot = tl.load(slots_ptr + row)
    s = tl.arange(0, QP)
    s_ok = s < Q
    to_end = tl.load(to_end_ptr + (row * Q + s) * H + head, mask=s_ok, other=0.0)
    decay = tl.load(decay_ptr + row * H + head)
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < N
        offs_b = ((row * Q + s[:, None]) * H + head) * N + n[None, :]
        bv = tl.load(b_ptr + offs_b, mask=s_ok[:, None] & n_ok[None, :], other=0.0)
        bt = bv * to_end[:, None]  # [QP, BLOCK_N], B * to_end rounded as torch rounds it
        for dp in range(BLOCK_P):
            p = p0 + dp
            if p < P:
                x = tl.load(xdt_ptr + ((row * Q + s) * H + head) * P + p, mask=s_ok, other=0.0)
                terms = x[:, None] * bt  # [QP, BLOCK_N]
                for level in tl.static_range(LEVELS):  # the pairwise tree: first half + second
                    halves = tl.reshape(terms, (2, QP >> (level + 1), BLOCK_N))
                    pair = tl.permute(halves, (1, 2, 0))
                    first, second = tl.split(pair)
                    terms = first + second
                own = tl.reshape(terms, (BLOCK_N,))
                offs_h = ((slot * H + head) * P + p) * N + n
                h = tl.load(state_ptr + offs_h, mask=n_ok, other=0.0)
                tl.store(state_ptr + offs_h, decay * h + own, mask=n_ok)


def commit_rows_(
    state: torch.Tensor,
    slots: torch.Tensor,
    full: torch.Tensor,
    B: torch.Tensor,
    to_end: torch.Tensor,
    xdt: torch.Tensor,
    decay: torch.Tensor,
) -> None:
    """state[slots[r]] <- decay[r] * state[slots[r]] + sum_s (B[r, s] * to_end[r, s]) * xdt[r, s]
    for each row r with full[r]; every tensor fp32 on one device (see `zkl.ops.ssd`)."""
    rows, chunk, heads, width = xdt.shape
    depth = B.shape[-1]
    if rows == 0:
        return
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise TypeError("commit_rows_ updates a contiguous fp32 state in place")
    qp = triton.next_power_of_2(chunk)
    block_p = 8
    _commit_kernel[(rows, heads, triton.cdiv(width, block_p))](
        state,
        slots.to(torch.int64).contiguous(),
        full.to(torch.int8).contiguous(),
        B.float().contiguous(),
        to_end.float().contiguous(),
        xdt.float().contiguous(),
        decay.float().contiguous(),
        chunk,
        heads,
        width,
        depth,
        QP=qp,
        LEVELS=qp.bit_length() - 1,
        BLOCK_P=block_p,
        BLOCK_N=min(64, triton.next_power_of_2(depth)),
        num_warps=4,
        enable_fp_fusion=False,  # one rounding per operation, as torch's elementwise ops
    )

"""Causal attention: one kernel for the train forward, chunked prefill and decode.

Each program takes BLOCK_M queries of one (row, head) and walks the keys in blocks of
BLOCK_N from position 0 with an fp32 online softmax. A decode step (one query a row) packs
the query heads of one KV head into the program's rows instead, so each KV head is read once:
a row's result is the same either way, as a tile row's never depends on the other rows.
A query's result depends only on its own position and the keys up to it: the key blocks
are the same for every caller, a block with no key visible to a query leaves that query's
state untouched (`tl.where`, not a multiply by exp(0)), and masked keys contribute exact
zeros. The decode path reads the KV
cache in place through `kv_rows` (the cache row of each batch row).

The backward (train path only) is PyTorch's SDPA on the same inputs: gradients are not
compared bitwise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

BLOCK_M = 16  # queries per program, the same for prefill, decode and scoring
BLOCK_N = 64  # keys per step of the walk
NUM_WARPS = 4


@triton.jit(do_not_specialize=["num_q", "num_keys"])
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    rows_ptr,
    out_ptr,
    s_qb,
    s_qh,
    s_qt,
    s_kb,
    s_kh,
    s_kt,
    s_vb,
    s_vh,
    s_vt,
    s_ob,
    s_oh,
    s_ot,
    s_pb,
    num_heads,
    num_kv_heads,
    groups,
    num_q,
    num_keys,
    sm_scale,
    HAS_ROWS: tl.constexpr,
    PACK_HEADS: tl.constexpr,
    PRECISION: tl.constexpr,  # 'ieee' for fp32 (no TF32), 'tf32' (ignored) for bf16
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    if PACK_HEADS:  # decode: the rows of a program are the heads of one KV head's group
        b = (pid_bh // num_kv_heads).to(tl.int64)
        kv_h = pid_bh % num_kv_heads
        lane = tl.arange(0, BLOCK_M)
        heads = kv_h * groups + lane
        offs_m = lane * 0  # every row is the one query
        valid_m = lane < groups
    else:  # the rows are BLOCK_M queries of one head
        b = (pid_bh // num_heads).to(tl.int64)
        h = pid_bh % num_heads
        kv_h = h // groups
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        heads = h + offs_m * 0
        valid_m = offs_m < num_q
    kv_b = b
    if HAS_ROWS:
        kv_b = tl.load(rows_ptr + b).to(tl.int64)

    offs_d = tl.arange(0, BLOCK_D)
    valid_d = offs_d < HEAD_DIM
    pos = tl.load(pos_ptr + b * s_pb + offs_m, mask=valid_m, other=-1).to(tl.int32)
    q = tl.load(
        q_ptr + b * s_qb + heads[:, None] * s_qh + offs_m[:, None] * s_qt + offs_d[None, :],
        mask=valid_m[:, None] & valid_d[None, :],
        other=0.0,
    )
    k_base = k_ptr + kv_b * s_kb + kv_h * s_kh
    v_base = v_ptr + kv_b * s_vb + kv_h * s_vh

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end = tl.max(pos, axis=0) + 1
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        in_buffer = offs_n < num_keys
        k = tl.load(
            k_base + offs_n[None, :] * s_kt + offs_d[:, None],
            mask=in_buffer[None, :] & valid_d[:, None],
            other=0.0,
        )  # [D, BLOCK_N]
        s = tl.dot(q, k, input_precision=PRECISION) * sm_scale
        visible = (offs_n[None, :] <= pos[:, None]) & in_buffer[None, :]
        s = tl.where(visible, s, float("-inf"))
        block_any = tl.max(visible.to(tl.int32), axis=1) > 0
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(block_any, m_new, 0.0)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        p = tl.where(visible, p, 0.0)
        v = tl.load(
            v_base + offs_n[:, None] * s_vt + offs_d[None, :],
            mask=in_buffer[:, None] & valid_d[None, :],
            other=0.0,
        )  # [BLOCK_N, D]
        pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        acc = tl.where(block_any[:, None], acc * alpha[:, None] + pv, acc)
        l_i = tl.where(block_any, l_i * alpha + tl.sum(p, axis=1), l_i)
        m_i = tl.where(block_any, m_new, m_i)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding queries see no key
    tl.store(
        out_ptr + b * s_ob + heads[:, None] * s_oh + offs_m[:, None] * s_ot + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=valid_m[:, None] & valid_d[None, :],
    )


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, H, Tq, D]; k, v [R, Hkv, Tk, D] (key j at position j); q_pos [B, Tq].

    Batch row b reads keys of row `kv_rows[b]` (default b).
    """
    batch, num_heads, num_q, head_dim = q.shape
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("attention needs a unit stride on the head dim")
    # [B, T, H, D] in memory, so the output projection reads it without a transpose copy
    out = torch.empty(batch, num_q, num_heads, head_dim, dtype=q.dtype, device=q.device)
    out = out.transpose(1, 2)
    if batch == 0 or num_q == 0:
        return out
    # read as they come (int32 or int64): a cast here would be two more kernels a layer
    positions = q_pos if q_pos.stride(-1) == 1 or num_q == 1 else q_pos.contiguous()
    rows = positions if kv_rows is None else kv_rows.contiguous()
    num_kv_heads = k.shape[1]
    groups = num_heads // num_kv_heads
    pack = num_q == 1 and groups <= BLOCK_M  # one program per KV head reads it once
    grid = (
        batch * (num_kv_heads if pack else num_heads),
        1 if pack else triton.cdiv(num_q, BLOCK_M),
    )
    _attention_kernel[grid](
        q,
        k,
        v,
        positions,
        rows,
        out,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        positions.stride(0),
        num_heads,
        num_kv_heads,
        groups,
        num_q,
        k.shape[2],
        1.0 / math.sqrt(head_dim),
        HAS_ROWS=kv_rows is not None,
        PACK_HEADS=pack,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS,
    )
    return out


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_pos):
        ctx.save_for_backward(q, k, v, q_pos)
        return attention_forward(q, k, v, q_pos)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, q_pos = ctx.saved_tensors
        mask = torch.arange(k.shape[2], device=q.device) <= q_pos.unsqueeze(-1)  # [B, Tq, Tk]
        with torch.enable_grad():
            qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
            out = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=mask.unsqueeze(1), enable_gqa=q.shape[1] != k.shape[1]
            )
            return (*torch.autograd.grad(out, (qd, kd, vd), grad), None)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    if kv_rows is None and torch.is_grad_enabled() and q.requires_grad:
        # contiguous: the backward's SDPA is slow on the projections' strided views
        return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), q_pos)
    return attention_forward(q, k, v, q_pos, kv_rows)

"""Candidate attention kernels for zero mode's spec, timed by scripts/attention_spec_probe.py.

- `forward`: a causal forward over queries 0..T-1 with unmasked blocks below the diagonal,
  either as fast Triton kernels are written (P.V inside the MMA, contraction on) or computing
  the spec of `zkl/ops/triton/attention_kernels.py` (separate P.V, one `tl.fma` a step, no
  contraction; with its chunk merge or one chunk), which must give the prefill's bits, or a
  spec that accumulates P.V inside the MMA onto the rescaled output (one register tile
  fewer; decode must then run the same MMA kind, as it must for the scores already);
- `decode_with`: zkl's decode chunk kernel with another combine: the spec's merges with the
  loads of UNROLL chunks in one straight line (the same bits), or flash-decoding's parallel
  combine (the default path's freedom: not the spec's order);
- `decode_prefix`: decode of the one-chunk spec (a single online softmax over 64-key blocks)
  with the blocks in parallel: each block's running max is the maximum of the block maxima
  before it (exact in any order), so each block's weights, sum and P.V are computed at once
  by the prefill's own block step, and only the `fma` chain over the blocks runs in order.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from zkl.ops.triton.attention_kernels import (
    CHUNK,
    KEY_BLOCK,
    LOG2E,
    NO_WINDOW,
    REF_WARPS,
    _block_step,
    _empty_state,
    _merge,
    _out_like,
    decode_partials,
    decode_split,
)
from zkl.ops.triton.gemm import precision, sm_count


@triton.jit
def _step(q, k_base, v_base, start, offs_m, offs_d, m_i, l_i, acc, s_t, qk_scale,
          BN: tl.constexpr, MASK: tl.constexpr, SPEC: tl.constexpr):  # fmt: skip
    offs_n = start + tl.arange(0, BN)
    k = tl.load(k_base + offs_n[None, :] * s_t + offs_d[:, None])
    v = tl.load(v_base + offs_n[:, None] * s_t + offs_d[None, :])
    s = tl.dot(q, k) * qk_scale
    if MASK:
        s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    if SPEC == 1:  # zkl's spec: P.V from zero, then one fma
        pv = tl.dot(p.to(v.dtype), v)
        acc = tl.fma(acc, alpha[:, None], pv)
    else:  # P.V accumulated inside the MMA onto the rescaled output
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    total = tl.sum(p, axis=1)
    l_i = l_i * alpha + total if SPEC == 0 else tl.fma(l_i, alpha, total)
    return m_new, l_i, acc


@triton.jit
def _forward(q_ptr, k_ptr, v_ptr, o_ptr, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_ob, s_oh, s_ot,
             num_heads, groups, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             SPEC: tl.constexpr, CHUNK_KEYS: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """Causal forward over queries 0..T-1 (T a multiple of BM, BM of BN, CHUNK_KEYS of BM):
    unmasked blocks below the diagonal, masked ones on it; CHUNK_KEYS > 0 merges chunks."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = pid_bh % num_heads
    kh = h // groups
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * s_qb + h * s_qh + offs_m[:, None] * s_qt + offs_d[None, :])
    k_base = k_ptr + b * s_kb + kh * s_kh
    v_base = v_ptr + b * s_kb + kh * s_kh
    lo = pid_m * BM
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    if CHUNK_KEYS == 0:
        for start in tl.range(0, lo, BN, num_stages=STAGES):
            m_i, l_i, acc = _step(q, k_base, v_base, start, offs_m, offs_d, m_i, l_i, acc, s_kt,
                                  qk_scale, BN, False, SPEC)  # fmt: skip
        for start in range(lo, lo + BM, BN):
            m_i, l_i, acc = _step(q, k_base, v_base, start, offs_m, offs_d, m_i, l_i, acc, s_kt,
                                  qk_scale, BN, True, SPEC)  # fmt: skip
    else:
        take = offs_m >= 0
        big_m, big_l, big_o = m_i, l_i, acc
        last = (lo // CHUNK_KEYS) * CHUNK_KEYS  # the chunk holding the diagonal
        for start in tl.range(0, last, BN, num_stages=STAGES):
            m_i, l_i, acc = _step(q, k_base, v_base, start, offs_m, offs_d, m_i, l_i, acc, s_kt,
                                  qk_scale, BN, False, SPEC)  # fmt: skip
            if (start + BN) % CHUNK_KEYS == 0:  # a chunk ends: merge it, start afresh
                big_m, big_l, big_o = _merge(big_m, big_l, big_o, m_i, l_i, acc, take)
                m_i = tl.full((BM,), float("-inf"), tl.float32)
                l_i = tl.zeros((BM,), tl.float32)
                acc = tl.zeros((BM, D), tl.float32)
        for start in range(last, lo + BM, BN):  # masks here are identities off the diagonal
            m_i, l_i, acc = _step(q, k_base, v_base, start, offs_m, offs_d, m_i, l_i, acc, s_kt,
                                  qk_scale, BN, True, SPEC)  # fmt: skip
        big_m, big_l, acc = _merge(big_m, big_l, big_o, m_i, l_i, acc, take)
        l_i = big_l
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty))  # fmt: skip


FORWARD_MODES = {"plain": 0, "fma": 1, "mma": 2}


def forward(q, k, v, bm: int, bn: int, warps: int, stages: int, mode: str, chunk: int):
    """`_forward` in `mode`: "plain" (contraction on, P.V inside the MMA), "fma" (zkl's
    spec), "mma" (the spec with P.V accumulated inside the MMA); `chunk` 0 for one chunk."""
    batch, heads, seq, dim = q.shape
    out = torch.empty(batch, seq, heads, dim, dtype=q.dtype, device=q.device).transpose(1, 2)
    _forward[(seq // bm, batch * heads)](
        q, k, v, out, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), out.stride(0), out.stride(1), out.stride(2), heads, heads // k.shape[1],
        LOG2E / math.sqrt(dim), D=dim, BM=bm, BN=bn, SPEC=FORWARD_MODES[mode], CHUNK_KEYS=chunk,
        STAGES=stages, num_warps=warps, enable_fp_fusion=mode == "plain",
    )  # fmt: skip
    return out


@triton.jit
def _slice_of_heads(pos_ptr, s_pb, num_heads, num_kv_heads, groups, max_parts,
                    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    PART_KEYS: tl.constexpr):  # fmt: skip
    """A combine program's (row, KV head, slice of the head dim): its packed query heads, the
    parts (chunks or blocks) its query sees and where their partials start."""
    pid_bk = tl.program_id(0)
    b = (pid_bk // num_kv_heads).to(tl.int64)
    lane = tl.arange(0, BLOCK_M)
    heads = (pid_bk % num_kv_heads) * groups + lane
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    p = tl.load(pos_ptr + b * s_pb).to(tl.int32)
    parts = tl.cdiv(p + 1, PART_KEYS)
    return b, heads, lane < groups, offs_d, parts, (b * num_heads + heads) * max_parts


@triton.jit
def _combine_unrolled(part_m_ptr, part_l_ptr, part_o_ptr, pos_ptr, out_ptr, s_pb, s_ob, s_oh,
                      num_heads, num_kv_heads, groups, max_chunks, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK_KEYS: tl.constexpr,
                      UNROLL: tl.constexpr):  # fmt: skip
    """zkl's combine (the same merges in the same order, no window, no sinks) with UNROLL
    chunks' loads in one straight line, so they are in flight together."""
    b, heads, valid_m, offs_d, n_chunks, part = _slice_of_heads(
        pos_ptr, s_pb, num_heads, num_kv_heads, groups, max_chunks, BLOCK_D, BLOCK_M, CHUNK_KEYS
    )
    valid_d = offs_d < HEAD_DIM
    big_m, big_l, big_o = _empty_state(BLOCK_M, BLOCK_D)
    for c0 in range(0, n_chunks, UNROLL):
        for j in tl.static_range(UNROLL):
            c = c0 + j
            take = valid_m & (c < n_chunks)
            m = tl.load(part_m_ptr + part + c, mask=take, other=0.0)
            l_c = tl.load(part_l_ptr + part + c, mask=take, other=0.0)
            o = tl.load(part_o_ptr + (part + c)[:, None] * HEAD_DIM + offs_d[None, :],
                        mask=take[:, None] & valid_d[None, :], other=0.0)  # fmt: skip
            big_m, big_l, big_o = _merge(big_m, big_l, big_o, m, l_c, o, take | ~valid_m)
    out = big_o / tl.where(big_l > 0, big_l, 1.0)[:, None]
    tl.store(out_ptr + b * s_ob + heads[:, None] * s_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty),
             mask=valid_m[:, None] & valid_d[None, :])  # fmt: skip


@triton.jit
def _combine_parallel(part_m_ptr, part_l_ptr, part_o_ptr, pos_ptr, out_ptr, s_pb, s_ob, s_oh,
                      num_heads, num_kv_heads, groups, max_chunks, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
                      CHUNK_KEYS: tl.constexpr):  # fmt: skip
    """Flash-decoding's combine (the default path may): one query head a program, BLOCK_C
    chunks at a time reduced as a tile against the running max. Not the spec's order."""
    pid = tl.program_id(0)
    b = (pid // num_heads).to(tl.int64)
    h = pid % num_heads
    offs_d = tl.arange(0, BLOCK_D)
    valid_d = offs_d < HEAD_DIM
    p = tl.load(pos_ptr + b * s_pb).to(tl.int32)
    n_chunks = tl.cdiv(p + 1, CHUNK_KEYS)
    part = (b * num_heads + h) * max_chunks
    big_m = tl.full((), float("-inf"), tl.float32)
    big_l = tl.zeros((), tl.float32)
    big_o = tl.zeros((BLOCK_D,), tl.float32)
    for c0 in range(0, n_chunks, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        live = c < n_chunks
        m = tl.load(part_m_ptr + part + c, mask=live, other=float("-inf"))
        l_c = tl.load(part_l_ptr + part + c, mask=live, other=0.0)
        o = tl.load(part_o_ptr + (part + c)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=live[:, None] & valid_d[None, :], other=0.0)  # fmt: skip
        m_new = tl.maximum(big_m, tl.max(m, axis=0))
        w = tl.exp2(m - m_new)
        a = tl.exp2(big_m - m_new)
        big_l = big_l * a + tl.sum(l_c * w, axis=0)
        big_o = big_o * a + tl.sum(o * w[:, None], axis=0)
        big_m = m_new
    tl.store(out_ptr + b * s_ob + h * s_oh + offs_d, (big_o / big_l).to(out_ptr.dtype.element_ty),
             mask=valid_d)  # fmt: skip


def decode_with(q, k, v, pos, rows, combine: str, chunk: int = CHUNK, rows_per_program=64,
                fp_fusion: bool = False, unroll: int = 8):  # fmt: skip
    """zkl's decode (its chunks kernel, the same split) with another combine."""
    batch, num_heads, _, head_dim = q.shape
    num_kv_heads = k.shape[1]
    groups = num_heads // num_kv_heads
    out = _out_like(q)
    positions = pos.reshape(batch, 1)
    part_m, part_l, part_o = decode_partials(
        q, k, v, positions, rows, chunk, rows_per_program, fp_fusion, window=0
    )
    max_chunks = part_m.shape[-1]
    common = (part_m, part_l, part_o, positions, out, positions.stride(0), out.stride(0),
              out.stride(1), num_heads, num_kv_heads, groups, max_chunks)  # fmt: skip
    if combine == "unrolled":
        _combine_unrolled[(batch * num_kv_heads, head_dim // 32)](
            *common, HEAD_DIM=head_dim, BLOCK_D=32, BLOCK_M=16, CHUNK_KEYS=chunk,
            UNROLL=unroll, num_warps=REF_WARPS, enable_fp_fusion=fp_fusion,
        )  # fmt: skip
    else:
        _combine_parallel[(batch * num_heads,)](
            *common, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_C=32, CHUNK_KEYS=chunk,
            num_warps=REF_WARPS, enable_fp_fusion=True,
        )  # fmt: skip
    return out


@triton.jit
def _decode_setup(q_ptr, pos_ptr, rows_ptr, s_qb, s_qh, s_pb, num_kv_heads, groups,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """One (row, KV head): its packed query heads, position and cache row."""
    pid_bk = tl.program_id(0)
    b = (pid_bk // num_kv_heads).to(tl.int64)
    kv_h = pid_bk % num_kv_heads
    kv_b = tl.load(rows_ptr + b).to(tl.int64)
    lane = tl.arange(0, BLOCK_M)
    heads = kv_h * groups + lane
    valid_m = lane < groups
    offs_d = tl.arange(0, HEAD_DIM)
    p = tl.load(pos_ptr + b * s_pb).to(tl.int32)
    q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + offs_d[None, :],
                mask=valid_m[:, None], other=0.0)  # fmt: skip
    return b, kv_h, kv_b, heads, valid_m, offs_d, p, q


@triton.jit
def _block_max_kernel(q_ptr, k_ptr, pos_ptr, rows_ptr, bmax_ptr, s_qb, s_qh, s_kb, s_kh, s_kt,
                      s_pb, num_heads, num_kv_heads, groups, num_keys, max_blocks, per_program,
                      qk_scale, PRECISION: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Phase 1: each visible block's score maximum a query head (the block step's scores)."""
    b, kv_h, kv_b, heads, valid_m, offs_d, p, q = _decode_setup(
        q_ptr, pos_ptr, rows_ptr, s_qb, s_qh, s_pb, num_kv_heads, groups, HEAD_DIM, BLOCK_M
    )
    k_base = k_ptr + kv_b * s_kb + kv_h * s_kh
    first = tl.program_id(1) * per_program
    last = tl.minimum(first + per_program, tl.cdiv(p + 1, BLOCK_N))
    row = (b * num_heads + heads) * max_blocks
    for j in range(first, last):
        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
        in_buffer = offs_n < num_keys
        k = tl.load(k_base + offs_n[None, :] * s_kt + offs_d[:, None], mask=in_buffer[None, :],
                    other=0.0)  # fmt: skip
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        visible = (offs_n[None, :] <= p) & in_buffer[None, :]
        s = tl.where(visible, s, float("-inf"))
        tl.store(bmax_ptr + row + j, tl.max(s, axis=1), mask=valid_m)


@triton.jit
def _block_weights_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, rows_ptr, bmax_ptr, alpha_ptr, sum_ptr,
                          pv_ptr, s_qb, s_qh, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_pb,
                          num_heads, num_kv_heads, groups, num_keys, max_blocks, per_program,
                          window, qk_scale, PRECISION: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_P: tl.constexpr):  # fmt: skip
    """Phase 2: each block's rescale, sum and P.V, the running max before it known: the
    prefill's block step from an empty sum and output (fma(0, a, x) is x)."""
    b, kv_h, kv_b, heads, valid_m, offs_d, p, q = _decode_setup(
        q_ptr, pos_ptr, rows_ptr, s_qb, s_qh, s_pb, num_kv_heads, groups, HEAD_DIM, BLOCK_M
    )
    k_base = k_ptr + kv_b * s_kb + kv_h * s_kh
    v_base = v_ptr + kv_b * s_vb + kv_h * s_vh
    first = tl.program_id(1) * per_program
    last = tl.minimum(first + per_program, tl.cdiv(p + 1, BLOCK_N))
    row = (b * num_heads + heads) * max_blocks
    m_run = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    for j0 in range(0, first, BLOCK_P):  # the maximum of the block maxima before `first`
        jj = j0 + tl.arange(0, BLOCK_P)
        seen = valid_m[:, None] & (jj < first)[None, :]
        before = tl.load(bmax_ptr + row[:, None] + jj[None, :], mask=seen, other=float("-inf"))
        m_run = tl.maximum(m_run, tl.max(before, axis=1))
    pos = tl.full((BLOCK_M,), 0, tl.int32) + p
    w_lo = pos - window  # no window: one wider than any position
    offs_dv = tl.arange(0, HEAD_DIM)
    valid_d = offs_dv < HEAD_DIM
    for j in range(first, last):
        zero_l = tl.zeros((BLOCK_M,), tl.float32)
        zero_o = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
        m_new, total, pv = _block_step(
            q, k_base, v_base, j * BLOCK_N, pos, w_lo, m_run, zero_l, zero_o, s_kt, s_vt,
            num_keys, qk_scale, offs_dv, valid_d, PRECISION, BLOCK_N,
        )  # fmt: skip
        tl.store(alpha_ptr + row + j, tl.exp2(m_run - m_new), mask=valid_m)
        tl.store(sum_ptr + row + j, total, mask=valid_m)
        tl.store(pv_ptr + (row + j)[:, None] * HEAD_DIM + offs_dv[None, :], pv,
                 mask=valid_m[:, None])  # fmt: skip
        m_run = m_new


@triton.jit
def _block_chain_kernel(alpha_ptr, sum_ptr, pv_ptr, pos_ptr, out_ptr, s_pb, s_ob, s_oh,
                        num_heads, num_kv_heads, groups, max_blocks, HEAD_DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        UNROLL: tl.constexpr):  # fmt: skip
    """Phase 3: the blocks' `fma` chain in order (UNROLL blocks' loads in one straight line),
    then the prefill's closing merge of its one chunk and the division."""
    b, heads, valid_m, offs_d, n_blocks, row = _slice_of_heads(
        pos_ptr, s_pb, num_heads, num_kv_heads, groups, max_blocks, BLOCK_D, BLOCK_M, BLOCK_N
    )
    m_i, l_i, acc = _empty_state(BLOCK_M, BLOCK_D)
    for j0 in range(0, n_blocks, UNROLL):
        for u in tl.static_range(UNROLL):
            j = j0 + u
            live = valid_m & (j < n_blocks)
            a = tl.load(alpha_ptr + row + j, mask=live, other=1.0)
            total = tl.load(sum_ptr + row + j, mask=live, other=0.0)
            pv = tl.load(pv_ptr + (row + j)[:, None] * HEAD_DIM + offs_d[None, :],
                         mask=live[:, None], other=0.0)  # fmt: skip
            acc = tl.where(live[:, None], tl.fma(acc, a[:, None], pv), acc)
            l_i = tl.where(live, tl.fma(l_i, a, total), l_i)
    # the running max after the last block only enters the merge as exp2(m - m) = 1
    m_last = tl.zeros((BLOCK_M,), tl.float32)
    big_m, big_l, big_o = _empty_state(BLOCK_M, BLOCK_D)
    big_m, big_l, big_o = _merge(big_m, big_l, big_o, m_last, l_i, acc, heads >= 0)
    out = big_o / tl.where(big_l > 0, big_l, 1.0)[:, None]
    tl.store(out_ptr + b * s_ob + heads[:, None] * s_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=valid_m[:, None])  # fmt: skip


def decode_prefix(q, k, v, pos, rows, rows_per_program: int = 64, unroll: int = 16):
    """Decode of the one-chunk spec (`prefill(..., chunk=1 << 30)`'s bits), blocks in
    parallel: block maxima, then each block's weights from the running max, then the chain."""
    batch, num_heads, _, head_dim = q.shape
    num_kv_heads = k.shape[1]
    groups = num_heads // num_kv_heads
    out = _out_like(q)
    positions = pos.reshape(batch, 1)
    max_blocks = triton.cdiv(k.shape[2], KEY_BLOCK)
    per_program = decode_split(batch, num_kv_heads, max_blocks, sm_count(q.device))
    f32 = {"dtype": torch.float32, "device": q.device}
    bmax = torch.empty(batch, num_heads, max_blocks, **f32)
    alpha, total = torch.empty_like(bmax), torch.empty_like(bmax)
    pv = torch.empty(batch, num_heads, max_blocks, head_dim, **f32)
    grid = (batch * num_kv_heads, triton.cdiv(max_blocks, per_program))
    scale = LOG2E / math.sqrt(head_dim)
    common = {"PRECISION": precision(q.dtype), "HEAD_DIM": head_dim, "BLOCK_M": rows_per_program,
              "BLOCK_N": KEY_BLOCK, "num_warps": REF_WARPS, "enable_fp_fusion": False}  # fmt: skip
    _block_max_kernel[grid](
        q, k, positions, rows, bmax, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        k.stride(2), positions.stride(0), num_heads, num_kv_heads, groups, k.shape[2],
        max_blocks, per_program, scale, **common,
    )  # fmt: skip
    _block_weights_kernel[grid](
        q, k, v, positions, rows, bmax, alpha, total, pv, q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        positions.stride(0), num_heads, num_kv_heads, groups, k.shape[2], max_blocks,
        per_program, NO_WINDOW, scale, BLOCK_P=64, **common,
    )  # fmt: skip
    _block_chain_kernel[(batch * num_kv_heads, triton.cdiv(head_dim, 32))](
        alpha, total, pv, positions, out, positions.stride(0), out.stride(0), out.stride(1),
        num_heads, num_kv_heads, groups, max_blocks, HEAD_DIM=head_dim, BLOCK_D=32, BLOCK_M=16,
        BLOCK_N=KEY_BLOCK, UNROLL=unroll, num_warps=REF_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    return out

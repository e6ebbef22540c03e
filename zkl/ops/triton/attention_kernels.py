"""Causal attention kernels on CUDA (Triton) and their launchers: the bits follow a query.

The spec every path computes for a query at position p (keys 0..p):
- keys in chunks of `CHUNK` counted from position 0; within a chunk, blocks of `KEY_BLOCK`
  keys in order with an fp32 online softmax (exp2 of log2-scaled scores) started afresh;
- the chunks' partial states (max, sum, unnormalized output) merged in chunk order 0, 1, ...
  by one fused multiply-add rule (`_merge`), then divided by the sum.

Prefill and scoring (`_prefill_kernel`) walk a tile of queries over all their chunks and merge
in registers; decode (`_decode_chunks_kernel` + `_combine_kernel`) computes the chunks of
one query in parallel programs (split-K over the key range, as flash-decoding does) and
merges their partials in the same order with the same rule. Both call the same block step
and merge, so prefill == decode == scoring bit for bit.

A tile row never depends on the other rows, but a reduction's order follows the tile's
register layout, so the large prefill tiles are used only where the device shows they give
the reference tile's bits (`attention_probe.choose`, once per head dim and dtype); the decode
tile (the query heads of one KV head packed into `REF_M` rows) is the reference tile.

A block with no key visible to a query leaves that query's state untouched (`_block_step`),
and a chunk with none is not merged (`_sees_chunk`). A sliding window (`window` W > 0: a
query at p sees the keys p-W+1..p) changes only which keys are visible: chunks are still
counted from position 0 and merged in order, so the window's edge falls inside a chunk the
same way on every path; chunks before the window of every query of a program are skipped,
which leaves the same bits as visiting them. Attention sinks (gpt-oss: one logit a head with
no value) are folded into the merged state once, after the last chunk, by one rule
(`_fold_sink`) in both the prefill and the combine kernel.
The zero-mode entry point with its backward is `attention.py`; the default path's policy
`attention_default.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from zkl.ops.triton.gemm import precision, sm_count

LOG2E = 1.4426950408889634

# The spec: a row's bits follow these two and nothing else.
KEY_BLOCK = 64  # keys per online-softmax step
CHUNK = 256  # keys per chunk; chunks are merged in order from position 0

NO_WINDOW = 1 << 30  # a window wider than any position: full causal attention
REF_M = 16  # the reference tile's rows (and decode's packed heads)
REF_WARPS = 4


@dataclass(frozen=True)
class Tile:
    rows: int  # queries a program
    warps: int
    stages: int
    nested: bool = False  # a loop over chunks around a pipelined loop over their blocks
    fp_fusion: bool = False  # let the compiler contract mul + add: the default path only
    interior: bool = False  # blocks every query of the tile sees whole run unmasked (flat only)


REFERENCE = Tile(REF_M, REF_WARPS, 2)
FP32_TILE = Tile(REF_M, REF_WARPS, 1)


@triton.jit
def _block_step(
    q,
    k_base,
    v_base,
    start,
    pos,
    w_lo,
    m_i,
    l_i,
    acc,
    s_kt,
    s_vt,
    num_keys,
    qk_scale,
    offs_d,
    valid_d,
    PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr = True,
    EVEN_D: tl.constexpr = False,
):
    """One block of keys into a chunk's online-softmax state (scores in log2 units): a
    query at `pos` sees the keys in (`w_lo`, `pos`] (w_lo = pos - window).

    The kernels run without fp contraction: every value is one rounding of one IEEE
    operation, so the same inputs give the same bits in every kernel that calls this.
    `MASKED=False` is for a block whose keys every live query sees, all inside the buffer:
    there each mask is an identity, so leaving them out gives the masked step's bits
    (`EVEN_D`: the head dim fills BLOCK_D, so no load needs a mask).
    """
    if not MASKED:
        return _visible_block_step(
            q, k_base, v_base, start, m_i, l_i, acc, s_kt, s_vt, qk_scale, offs_d, valid_d,
            PRECISION, BLOCK_N, EVEN_D,
        )  # fmt: skip
    offs_n = start + tl.arange(0, BLOCK_N)
    in_buffer = offs_n < num_keys
    k = tl.load(
        k_base + offs_n[None, :] * s_kt + offs_d[:, None],
        mask=in_buffer[None, :] & valid_d[:, None],
        other=0.0,
    )  # [D, BLOCK_N]
    v = tl.load(
        v_base + offs_n[:, None] * s_vt + offs_d[None, :],
        mask=in_buffer[:, None] & valid_d[None, :],
        other=0.0,
    )  # [BLOCK_N, D]
    s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
    visible = (offs_n[None, :] <= pos[:, None]) & (offs_n[None, :] > w_lo[:, None])
    visible = visible & in_buffer[None, :]
    s = tl.where(visible, s, float("-inf"))
    block_any = tl.max(visible.to(tl.int32), axis=1) > 0
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(block_any, m_new, 0.0)
    # a query that sees no key here keeps its state: its weights are exp2(-inf) = 0, so its
    # P.V row is zero and fma(acc, 1, 0) is acc, up to the sign of an exact zero (a select
    # over the [rows, D] output instead holds it twice: the large tiles spill)
    alpha = tl.where(block_any, tl.exp2(m_i - m_safe), 1.0)
    p = tl.exp2(s - m_safe[:, None])
    pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    acc = tl.fma(acc, alpha[:, None], pv)
    l_i = tl.fma(l_i, alpha, tl.sum(p, axis=1))
    m_i = tl.where(block_any, m_new, m_i)
    return m_i, l_i, acc


@triton.jit
def _visible_block_step(
    q, k_base, v_base, start, m_i, l_i, acc, s_kt, s_vt, qk_scale, offs_d, valid_d,
    PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
):  # fmt: skip
    """`_block_step` where every key is visible to every live query: the same operations in
    the same order, the masks' identities left out."""
    offs_n = start + tl.arange(0, BLOCK_N)
    k_ptrs = k_base + offs_n[None, :] * s_kt + offs_d[:, None]
    v_ptrs = v_base + offs_n[:, None] * s_vt + offs_d[None, :]
    if EVEN_D:
        k = tl.load(k_ptrs)  # [D, BLOCK_N]
        v = tl.load(v_ptrs)  # [BLOCK_N, D]
    else:
        k = tl.load(k_ptrs, mask=valid_d[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=valid_d[None, :], other=0.0)
    s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    acc = tl.fma(acc, alpha[:, None], pv)
    l_i = tl.fma(l_i, alpha, tl.sum(p, axis=1))
    return m_new, l_i, acc


@triton.jit
def _merge(big_m, big_l, big_o, m, s, o, take):
    """Chunk partial (max m, sum s, output o) into the running state where `take`: one rule
    for every path."""
    m_new = tl.maximum(big_m, m)
    a = tl.exp2(big_m - m_new)
    b = tl.exp2(m - m_new)
    l_new = tl.fma(big_l, a, s * b)
    o_new = tl.fma(big_o, a[:, None], o * b[:, None])
    return (
        tl.where(take, m_new, big_m),
        tl.where(take, l_new, big_l),
        tl.where(take[:, None], o_new, big_o),
    )


@triton.jit
def _fold_sink(big_m, big_l, big_o, sink):
    """The sink logit (log2 units, one a row) into the merged state: it adds to the sum and
    nothing to the output. The last step before the division, on every path."""
    m_new = tl.maximum(big_m, sink)
    a = tl.exp2(big_m - m_new)
    return tl.fma(big_l, a, tl.exp2(sink - m_new)), big_o * a[:, None]


@triton.jit
def _empty_state(BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """An online softmax before its first key: max -inf, sum 0, output 0."""
    return (
        tl.full((BLOCK_M,), float("-inf"), tl.float32),
        tl.zeros((BLOCK_M,), tl.float32),
        tl.zeros((BLOCK_M, BLOCK_D), tl.float32),
    )


@triton.jit
def _sees_chunk(c_lo, pos, w_lo, CHUNK_KEYS: tl.constexpr):
    """Whether a query sees any key of the chunk at `c_lo`: only such chunks are merged (one
    with no visible key would merge its empty state; with none before it, 0 * inf)."""
    return (c_lo <= pos) & (c_lo + CHUNK_KEYS > w_lo + 1)


@triton.jit
def _first_chunk(p, window, CHUNK_KEYS: tl.constexpr):
    """The first chunk holding a key a query at `p` sees (keys p - window + 1 .. p)."""
    return tl.maximum(p - window + 1, 0) // CHUNK_KEYS


@triton.jit
def _kv_row(rows_ptr, b, HAS_ROWS: tl.constexpr):
    """The cache row batch row `b` reads: its own, or `rows[b]` (the scheduler's slots)."""
    kv_b = b
    if HAS_ROWS:
        kv_b = tl.load(rows_ptr + b).to(tl.int64)
    return kv_b


@triton.jit
def _flat_step(
    q, k_base, v_base, start, end, pos, w_lo, m_i, l_i, acc, big_m, big_l, big_o, s_kt, s_vt,
    num_keys, qk_scale, offs_d, valid_d, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK_KEYS: tl.constexpr,
    MASKED: tl.constexpr, EVEN_D: tl.constexpr,
):  # fmt: skip
    """One block step of the flat prefill loop; where it ends a chunk, the chunk's state is
    merged into the running one and started afresh."""
    m_i, l_i, acc = _block_step(
        q, k_base, v_base, start, pos, w_lo, m_i, l_i, acc, s_kt, s_vt, num_keys, qk_scale,
        offs_d, valid_d, PRECISION, BLOCK_N, MASKED, EVEN_D,
    )  # fmt: skip
    stop = start + BLOCK_N
    if (stop % CHUNK_KEYS == 0) | (stop >= end):
        take = _sees_chunk((start // CHUNK_KEYS) * CHUNK_KEYS, pos, w_lo, CHUNK_KEYS)
        big_m, big_l, big_o = _merge(big_m, big_l, big_o, m_i, l_i, acc, take)
        m_i, l_i, acc = _empty_state(BLOCK_M, BLOCK_D)
    return m_i, l_i, acc, big_m, big_l, big_o


@triton.jit(do_not_specialize=["num_q", "num_keys", "num_m_blocks", "window"])
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    rows_ptr,
    sinks_ptr,
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
    s_pt,
    num_heads,
    groups,
    num_q,
    num_keys,
    num_m_blocks,
    window,
    qk_scale,
    HAS_ROWS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    PRECISION: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNK_KEYS: tl.constexpr,
    STAGES: tl.constexpr,
    NESTED: tl.constexpr,
    INTERIOR: tl.constexpr,
):
    pid_m = num_m_blocks - 1 - tl.program_id(0)  # the longest key ranges start first
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = pid_bh % num_heads
    kv_h = h // groups
    kv_b = _kv_row(rows_ptr, b, HAS_ROWS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    valid_m = offs_m < num_q
    offs_d = tl.arange(0, BLOCK_D)
    valid_d = offs_d < HEAD_DIM
    pos = tl.load(pos_ptr + b * s_pb + offs_m * s_pt, mask=valid_m, other=-1).to(tl.int32)
    q = tl.load(
        q_ptr + b * s_qb + h * s_qh + offs_m[:, None] * s_qt + offs_d[None, :],
        mask=valid_m[:, None] & valid_d[None, :],
        other=0.0,
    )
    k_base = k_ptr + kv_b * s_kb + kv_h * s_kh
    v_base = v_ptr + kv_b * s_vb + kv_h * s_vh
    end = tl.max(pos, axis=0) + 1
    w_lo = pos - window
    # chunks before every query's window would leave every state untouched: start after them
    first_pos = tl.min(tl.where(valid_m, pos, end), axis=0)
    c_first = _first_chunk(first_pos, window, CHUNK_KEYS) * CHUNK_KEYS
    big_m, big_l, big_o = _empty_state(BLOCK_M, BLOCK_D)
    if NESTED:
        for c_lo in range(c_first, end, CHUNK_KEYS):
            m_i, l_i, acc = _empty_state(BLOCK_M, BLOCK_D)
            c_hi = tl.minimum(c_lo + CHUNK_KEYS, end)
            for start in tl.range(c_lo, c_hi, BLOCK_N, num_stages=STAGES):
                m_i, l_i, acc = _block_step(
                    q, k_base, v_base, start, pos, w_lo, m_i, l_i, acc, s_kt, s_vt, num_keys,
                    qk_scale, offs_d, valid_d, PRECISION, BLOCK_N,
                )  # fmt: skip
            take = _sees_chunk(c_lo, pos, w_lo, CHUNK_KEYS)
            big_m, big_l, big_o = _merge(big_m, big_l, big_o, m_i, l_i, acc, take)
    else:
        m_i, l_i, acc = _empty_state(BLOCK_M, BLOCK_D)
        full_hi = c_first
        if INTERIOR:  # the blocks every live query sees whole: unmasked, pipelined
            w_lo_max = tl.max(w_lo, axis=0)  # a padding query's (position -1) is below any key
            seen_hi = (tl.minimum(first_pos + 1, num_keys) // BLOCK_N) * BLOCK_N
            full_hi = tl.where(w_lo_max < c_first, tl.maximum(seen_hi, c_first), c_first)
            for start in tl.range(c_first, full_hi, BLOCK_N, num_stages=STAGES):
                m_i, l_i, acc, big_m, big_l, big_o = _flat_step(
                    q, k_base, v_base, start, end, pos, w_lo, m_i, l_i, acc, big_m, big_l,
                    big_o, s_kt, s_vt, num_keys, qk_scale, offs_d, valid_d, PRECISION,
                    BLOCK_M, BLOCK_D, BLOCK_N, CHUNK_KEYS, False, HEAD_DIM == BLOCK_D,
                )  # fmt: skip
        for start in tl.range(full_hi, end, BLOCK_N, num_stages=1 if INTERIOR else STAGES):
            m_i, l_i, acc, big_m, big_l, big_o = _flat_step(
                q, k_base, v_base, start, end, pos, w_lo, m_i, l_i, acc, big_m, big_l, big_o,
                s_kt, s_vt, num_keys, qk_scale, offs_d, valid_d, PRECISION, BLOCK_M, BLOCK_D,
                BLOCK_N, CHUNK_KEYS, True, False,
            )  # fmt: skip
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h + tl.zeros((BLOCK_M,), tl.int32))
        big_l, big_o = _fold_sink(big_m, big_l, big_o, sink)
    # padding queries see no key; + 0.0 writes an exact zero as +0 on every path (a block a
    # query does not see may turn a -0 into +0, see _block_step)
    out = big_o / tl.where(big_l > 0, big_l, 1.0)[:, None] + 0.0
    tl.store(
        out_ptr + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=valid_m[:, None] & valid_d[None, :],
    )


@triton.jit(do_not_specialize=["num_keys", "chunks_per_program", "window"])
def _decode_chunks_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    rows_ptr,
    part_m_ptr,
    part_l_ptr,
    part_o_ptr,
    s_qb,
    s_qh,
    s_kb,
    s_kh,
    s_kt,
    s_vb,
    s_vh,
    s_vt,
    s_pb,
    num_heads,
    num_kv_heads,
    groups,
    num_keys,
    max_chunks,
    chunks_per_program,
    window,
    qk_scale,
    HAS_ROWS: tl.constexpr,
    PRECISION: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNK_KEYS: tl.constexpr,
    STAGES: tl.constexpr,
):
    """One query a row: its chunks [c0, c0 + chunks_per_program) into the partials."""
    pid_bk = tl.program_id(0)
    b = (pid_bk // num_kv_heads).to(tl.int64)
    kv_h = pid_bk % num_kv_heads
    kv_b = _kv_row(rows_ptr, b, HAS_ROWS)
    lane = tl.arange(0, BLOCK_M)
    heads = kv_h * groups + lane
    valid_m = lane < groups
    offs_d = tl.arange(0, BLOCK_D)
    valid_d = offs_d < HEAD_DIM
    p = tl.load(pos_ptr + b * s_pb).to(tl.int32)
    pos = tl.full((BLOCK_M,), 0, tl.int32) + p
    w_lo = pos - window
    end = p + 1
    q = tl.load(
        q_ptr + b * s_qb + heads[:, None] * s_qh + offs_d[None, :],
        mask=valid_m[:, None] & valid_d[None, :],
        other=0.0,
    )
    k_base = k_ptr + kv_b * s_kb + kv_h * s_kh
    v_base = v_ptr + kv_b * s_vb + kv_h * s_vh
    first = tl.program_id(1) * chunks_per_program
    last = tl.minimum(first + chunks_per_program, tl.cdiv(end, CHUNK_KEYS))
    part = (b * num_heads + heads) * max_chunks
    # chunks before the window: no partial (the combine starts after them)
    lo = tl.maximum(first, _first_chunk(p, window, CHUNK_KEYS)) * CHUNK_KEYS
    hi = tl.minimum(last * CHUNK_KEYS, end)
    m_i, l_i, acc = _empty_state(BLOCK_M, BLOCK_D)
    for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        m_i, l_i, acc = _block_step(
            q, k_base, v_base, start, pos, w_lo, m_i, l_i, acc, s_kt, s_vt, num_keys, qk_scale,
            offs_d, valid_d, PRECISION, BLOCK_N,
        )  # fmt: skip
        stop = start + BLOCK_N
        if (stop % CHUNK_KEYS == 0) | (stop >= end):  # a chunk ends: its partial out
            c = start // CHUNK_KEYS
            tl.store(part_m_ptr + part + c, m_i, mask=valid_m)
            tl.store(part_l_ptr + part + c, l_i, mask=valid_m)
            tl.store(
                part_o_ptr + (part + c)[:, None] * HEAD_DIM + offs_d[None, :],
                acc,
                mask=valid_m[:, None] & valid_d[None, :],
            )
            m_i, l_i, acc = _empty_state(BLOCK_M, BLOCK_D)


@triton.jit(do_not_specialize=["window"])
def _combine_kernel(
    part_m_ptr,
    part_l_ptr,
    part_o_ptr,
    pos_ptr,
    sinks_ptr,
    out_ptr,
    s_pb,
    s_ob,
    s_oh,
    num_heads,
    num_kv_heads,
    groups,
    max_chunks,
    window,
    HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK_KEYS: tl.constexpr,
):
    """The chunk partials of one query merged in chunk order: the prefill's merge, each
    program on BLOCK_D of the head dim (the merge is elementwise; max and sum are redone
    identically by every program)."""
    pid_bk = tl.program_id(0)
    b = (pid_bk // num_kv_heads).to(tl.int64)
    kv_h = pid_bk % num_kv_heads
    lane = tl.arange(0, BLOCK_M)
    heads = kv_h * groups + lane
    valid_m = lane < groups
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    valid_d = offs_d < HEAD_DIM
    p = tl.load(pos_ptr + b * s_pb).to(tl.int32)
    n_chunks = tl.cdiv(p + 1, CHUNK_KEYS)
    part = (b * num_heads + heads) * max_chunks
    big_m, big_l, big_o = _empty_state(BLOCK_M, BLOCK_D)
    take = lane >= 0
    for c in tl.range(_first_chunk(p, window, CHUNK_KEYS), n_chunks, num_stages=3):
        m = tl.load(part_m_ptr + part + c, mask=valid_m, other=0.0)
        l_c = tl.load(part_l_ptr + part + c, mask=valid_m, other=0.0)
        o = tl.load(
            part_o_ptr + (part + c)[:, None] * HEAD_DIM + offs_d[None, :],
            mask=valid_m[:, None] & valid_d[None, :],
            other=0.0,
        )
        big_m, big_l, big_o = _merge(big_m, big_l, big_o, m, l_c, o, take)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + heads, mask=valid_m, other=0.0)
        big_l, big_o = _fold_sink(big_m, big_l, big_o, sink)
    out = big_o / tl.where(big_l > 0, big_l, 1.0)[:, None] + 0.0  # +0 as the prefill's
    tl.store(
        out_ptr + b * s_ob + heads[:, None] * s_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=valid_m[:, None] & valid_d[None, :],
    )


def _out_like(q: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] whose memory is [B, T, H, D], so o_proj reads it without a copy."""
    batch, num_heads, num_q, head_dim = q.shape
    out = torch.empty(batch, num_q, num_heads, head_dim, dtype=q.dtype, device=q.device)
    return out.transpose(1, 2)


def _window(window: int) -> int:
    """The kernels' window argument: keys (p - window, p]; no window is one past any position."""
    assert window >= 0, window
    return window if window else NO_WINDOW


def _check(q, k, v) -> None:
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("attention needs a unit stride on the head dim")


def _sinks_log2(sinks: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The sinks [H] in the kernels' log2 units (fp32), one multiply shared by every path;
    a dummy pointer when there are none."""
    if sinks is None:
        return like
    return (sinks.detach().float() * LOG2E).contiguous()


def prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    tile: Tile = REFERENCE,
    chunk: int = CHUNK,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Many queries a row (scoring, prefill): query tiles over their chunks, merged in order.

    `tile` is the probe's choice (`attention_probe.choose`) or the reference; `chunk` other
    than CHUNK is the default path's (one chunk: no merge at all).
    """
    _check(q, k, v)
    batch, num_heads, num_q, head_dim = q.shape
    out = _out_like(q)
    if batch == 0 or num_q == 0:
        return out
    positions = q_pos if q_pos.dim() == 2 else q_pos.view(batch, num_q)
    rows = positions if kv_rows is None else kv_rows.contiguous()
    num_m_blocks = triton.cdiv(num_q, tile.rows)
    _prefill_kernel[(num_m_blocks, batch * num_heads)](
        q, k, v, positions, rows, _sinks_log2(sinks, positions), out,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        positions.stride(0), positions.stride(1),
        num_heads, num_heads // k.shape[1], num_q, k.shape[2], num_m_blocks, _window(window),
        LOG2E / math.sqrt(head_dim),
        HAS_ROWS=kv_rows is not None,
        HAS_SINKS=sinks is not None,
        PRECISION=precision(q.dtype),
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=tile.rows,
        BLOCK_N=KEY_BLOCK,
        CHUNK_KEYS=chunk,
        STAGES=tile.stages,
        NESTED=tile.nested,
        INTERIOR=tile.interior and not tile.nested,
        num_warps=tile.warps,
        enable_fp_fusion=tile.fp_fusion,
    )  # fmt: skip
    return out


def decode_split(num_rows: int, num_kv_heads: int, max_chunks: int, sms: int) -> int:
    """Chunks per decode program: enough programs for about four waves, no fewer chunks
    than one a program. Speed only: each chunk's partial is the same whoever computes it."""
    programs = num_rows * num_kv_heads * max_chunks
    return max(1, programs // (4 * sms))


def decode_partials(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    kv_rows: torch.Tensor | None,
    chunk: int,
    rows_per_program: int,
    fp_fusion: bool,
    window: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode's first kernel: each chunk's partial state (max, sum [B, H, C], unnormalized
    output [B, H, C, D]) for one query a row at `positions` [B, 1], chunks in parallel."""
    batch, num_heads, _, head_dim = q.shape
    num_kv_heads = k.shape[1]
    rows = positions if kv_rows is None else kv_rows.contiguous()
    max_chunks = triton.cdiv(k.shape[2], chunk)
    per_program = decode_split(batch, num_kv_heads, max_chunks, sm_count(q.device))
    part_m = torch.empty(batch, num_heads, max_chunks, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_o = torch.empty(batch, num_heads, max_chunks, head_dim, dtype=torch.float32,
                         device=q.device)  # fmt: skip
    grid = (batch * num_kv_heads, triton.cdiv(max_chunks, per_program))
    _decode_chunks_kernel[grid](
        q, k, v, positions, rows, part_m, part_l, part_o,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        positions.stride(0),
        num_heads, num_kv_heads, num_heads // num_kv_heads, k.shape[2], max_chunks,
        per_program, _window(window),
        LOG2E / math.sqrt(head_dim),
        HAS_ROWS=kv_rows is not None,
        PRECISION=precision(q.dtype),
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=rows_per_program,
        BLOCK_N=KEY_BLOCK,
        CHUNK_KEYS=chunk,
        STAGES=3,
        num_warps=REF_WARPS,
        enable_fp_fusion=fp_fusion,
    )  # fmt: skip
    return part_m, part_l, part_o


def decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    chunk: int = CHUNK,
    rows_per_program: int = REF_M,
    fp_fusion: bool = False,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query a row: its chunks in parallel programs, then merged in order.

    The grid follows the key buffer's length, never the positions, so nothing is read back
    to the host and a CUDA graph can hold the step. `fp_fusion` (the default path's) lets
    the compiler contract mul + add, which zero mode never does (see PREFILL_TILES).
    """
    _check(q, k, v)
    batch, num_heads, _, head_dim = q.shape
    num_kv_heads = k.shape[1]
    out = _out_like(q)
    if batch == 0:
        return out
    positions = q_pos.reshape(batch, 1)
    part_m, part_l, part_o = decode_partials(
        q, k, v, positions, kv_rows, chunk, rows_per_program, fp_fusion, window
    )
    block_d = max(16, triton.next_power_of_2(head_dim))
    slice_d = min(block_d, 32)
    _combine_kernel[(batch * num_kv_heads, triton.cdiv(block_d, slice_d))](
        part_m, part_l, part_o, positions, _sinks_log2(sinks, positions), out,
        positions.stride(0), out.stride(0), out.stride(1),
        num_heads, num_kv_heads, num_heads // num_kv_heads, part_m.shape[-1], _window(window),
        HAS_SINKS=sinks is not None,
        HEAD_DIM=head_dim,
        BLOCK_D=slice_d,
        BLOCK_M=rows_per_program,
        CHUNK_KEYS=chunk,
        num_warps=REF_WARPS,
        enable_fp_fusion=fp_fusion,
    )  # fmt: skip
    return out

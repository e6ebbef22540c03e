"""Where zero mode's Triton prefill loses to SDPA, and what the spec itself costs (CUDA).

    python scripts/attention_spec_probe.py [--out attention_spec.json]

At the 1.5B's attention layer (12 query / 2 KV heads, d 128, bf16), 2 x 8k and 1 x 16k causal
forwards, every kernel timed side by side with SDPA's flash:
- `zkl/…`: `attention_kernels.prefill` as zero mode runs it (chunks of 256 keys merged in order)
  and with one chunk (a single online softmax), per candidate tile;
- `plain/…`: a causal flash forward written as fast Triton kernels are (masks on the diagonal
  block only, P.V accumulated inside the MMA, contraction on): what Triton reaches here;
- `spec/…`: the same kernel computing zero mode's spec (separate P.V, one `fma` a step, no
  contraction), with and without the spec's chunk merge: what the spec's rules cost.
`spec` with chunks is checked bit for bit against `zkl` at the same tile (the interior blocks'
masks are identities, so an unmasked interior must give the same bits).
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from zkl.lab.timing import cuda_time, graph_time
from zkl.ops.triton.attention_default import default_chunk
from zkl.ops.triton.attention_kernels import (
    CHUNK,
    KEY_BLOCK,
    LOG2E,
    NO_WINDOW,
    REF_WARPS,
    Tile,
    _decode_chunks_kernel,
    _empty_state,
    _merge,
    decode,
    decode_split,
    prefill,
)
from zkl.ops.triton.gemm import precision, sm_count

HEADS, KV_HEADS, HEAD_DIM = 12, 2, 128


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
    if SPEC:
        pv = tl.dot(p.to(v.dtype), v)
        acc = tl.fma(acc, alpha[:, None], pv)
        l_i = tl.fma(l_i, alpha, tl.sum(p, axis=1))
    else:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
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
        for c_lo in range(0, last, CHUNK_KEYS):
            m_i = tl.full((BM,), float("-inf"), tl.float32)
            l_i = tl.zeros((BM,), tl.float32)
            acc = tl.zeros((BM, D), tl.float32)
            for j in tl.static_range(CHUNK_KEYS // BN):
                m_i, l_i, acc = _step(q, k_base, v_base, c_lo + j * BN, offs_m, offs_d, m_i, l_i,
                                      acc, s_kt, qk_scale, BN, False, SPEC)  # fmt: skip
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


def forward(q, k, v, bm: int, bn: int, warps: int, stages: int, spec: bool, chunk: int):
    batch, heads, seq, dim = q.shape
    out = torch.empty(batch, seq, heads, dim, dtype=q.dtype, device=q.device).transpose(1, 2)
    _forward[(seq // bm, batch * heads)](
        q, k, v, out, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), out.stride(0), out.stride(1), out.stride(2), heads, heads // k.shape[1],
        LOG2E / math.sqrt(dim), D=dim, BM=bm, BN=bn, SPEC=spec, CHUNK_KEYS=chunk,
        STAGES=stages, num_warps=warps, enable_fp_fusion=not spec,
    )  # fmt: skip
    return out


@triton.jit
def _combine_unrolled(part_m_ptr, part_l_ptr, part_o_ptr, pos_ptr, out_ptr, s_pb, s_ob, s_oh,
                      num_heads, num_kv_heads, groups, max_chunks, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK_KEYS: tl.constexpr,
                      UNROLL: tl.constexpr):  # fmt: skip
    """zkl's combine (the same merges in the same order, no window, no sinks) with UNROLL
    chunks' loads in one straight line, so they are in flight together."""
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
    out = torch.empty(batch, 1, num_heads, head_dim, dtype=q.dtype, device=q.device)
    out = out.transpose(1, 2)
    positions = pos.reshape(batch, 1)
    max_chunks = triton.cdiv(k.shape[2], chunk)
    per_program = decode_split(batch, num_kv_heads, max_chunks, sm_count(q.device))
    part_m = torch.empty(batch, num_heads, max_chunks, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_o = torch.empty(batch, num_heads, max_chunks, head_dim, dtype=torch.float32,
                         device=q.device)  # fmt: skip
    _decode_chunks_kernel[(batch * num_kv_heads, triton.cdiv(max_chunks, per_program))](
        q, k, v, positions, rows, part_m, part_l, part_o, q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        positions.stride(0), num_heads, num_kv_heads, groups, k.shape[2], max_chunks,
        per_program, NO_WINDOW, LOG2E / math.sqrt(head_dim), HAS_ROWS=True,
        PRECISION=precision(q.dtype), HEAD_DIM=head_dim, BLOCK_D=head_dim,
        BLOCK_M=rows_per_program, BLOCK_N=KEY_BLOCK, CHUNK_KEYS=chunk, STAGES=3,
        num_warps=REF_WARPS, enable_fp_fusion=fp_fusion,
    )  # fmt: skip
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


def decode_profile() -> dict[str, object]:
    """zkl's decode at b1/b16 against SDPA (graph-timed), and its kernels' device time."""

    out: dict[str, object] = {}
    for batch, ctx in ((1, 8192), (1, 32768), (16, 32768)):
        out.update(_decode_shape(batch, ctx))
    return out


def _decode_shape(batch: int, ctx: int) -> dict[str, object]:
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, object] = {}
    g = torch.Generator(device="cuda").manual_seed(ctx)
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    q = q.transpose(1, 2)
    k, v = (torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device="cuda", generator=g).bfloat16()
            for _ in range(2))  # fmt: skip
    pos = torch.full((batch, 1), ctx - 1, device="cuda")
    rows = torch.arange(batch, device="cuda")
    qc = q.contiguous()
    sdpa = graph_time(lambda: F.scaled_dot_product_attention(qc, k, v, enable_gqa=True))
    key = f"decode/b{batch}/ctx{ctx}"
    out[f"{key}/sdpa_us"] = sdpa * 1e6
    for r in (16, 64):
        t = graph_time(lambda r=r: decode(q, k, v, pos, rows, rows_per_program=r))
        out[f"{key}/zkl_rows{r}_us"] = t * 1e6
        out[f"{key}/zkl_rows{r}_over_sdpa_speed"] = sdpa / t
    ref = decode(q, k, v, pos, rows, rows_per_program=64)
    for unroll in (8, 16, 32):
        args = (q, k, v, pos, rows, "unrolled")
        t = graph_time(lambda a=args, u=unroll: decode_with(*a, unroll=u))
        out[f"{key}/zkl_unrolled{unroll}_over_sdpa_speed"] = sdpa / t
        same = torch.equal(decode_with(*args, unroll=unroll), ref)
        out[f"{key}/zkl_unrolled{unroll}_equal_zkl"] = bool(same)
    # a spec of 512-key chunks: half the merges, half the decode programs
    t = graph_time(lambda: decode_with(q, k, v, pos, rows, "unrolled", chunk=512, unroll=16))
    out[f"{key}/chunk512_unrolled16_over_sdpa_speed"] = sdpa / t
    chunk = default_chunk(batch, KV_HEADS, ctx, sm_count(q.device))
    t = graph_time(lambda: decode(q, k, v, pos, rows, chunk=chunk, fp_fusion=True))
    out[f"{key}/default_triton_over_sdpa_speed"] = sdpa / t
    for c in sorted({chunk, 256, 512, 1024}):
        t = graph_time(lambda c=c: decode_with(q, k, v, pos, rows, "parallel", chunk=c,
                                               rows_per_program=16, fp_fusion=True))  # fmt: skip
        out[f"{key}/default_parallel_chunk{c}_over_sdpa_speed"] = sdpa / t
    try:  # where the decode's time goes, kernel by kernel
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                decode(q, k, v, pos, rows, rows_per_program=64)
            torch.cuda.synchronize()
        for ev in prof.key_averages():
            if "kernel" in ev.key:
                out[f"{key}/kernel/{ev.key[:40]}_us"] = ev.device_time_total / 5
    except (AttributeError, RuntimeError) as exc:
        out[f"{key}/kernel/error"] = repr(exc)[:200]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="attention_spec.json")
    args = parser.parse_args()
    out: dict[str, object] = {"device": torch.cuda.get_device_name()}
    parts = [lambda: _forward_shape(2, 8192), lambda: _forward_shape(1, 16384), decode_profile]
    for part in parts:  # each part's rows saved as they come: a time bound keeps the others
        out.update(part())
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    for name, value in out.items():
        print(f"{name:60} {value:.4g}" if isinstance(value, float) else f"{name:60} {value}")


def _forward_shape(batch: int, seq: int) -> dict[str, object]:
    out: dict[str, object] = {}
    g = torch.Generator(device="cuda").manual_seed(seq)
    q = torch.randn(batch, seq, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    q = q.transpose(1, 2)
    k, v = (torch.randn(batch, KV_HEADS, seq, HEAD_DIM, device="cuda", generator=g).bfloat16()
            for _ in range(2))  # fmt: skip
    pos = torch.arange(seq, device="cuda").expand(batch, seq)
    qc = q.contiguous()
    kr, vr = (t.repeat_interleave(HEADS // KV_HEADS, 1) for t in (k, v))
    sdpa = min(
        cuda_time(
            lambda: F.scaled_dot_product_attention(qc, k, v, is_causal=True, enable_gqa=True)
        ),
        cuda_time(lambda: F.scaled_dot_product_attention(qc, kr, vr, is_causal=True)),
    )
    flops = 4 * batch * HEADS * HEAD_DIM * seq * seq / 2
    key = f"T{seq}"
    out[f"{key}/sdpa_tflops"] = flops / sdpa / 1e12
    rows: dict[str, object] = {}
    for tile in (Tile(128, 8, 3), Tile(128, 8, 3, nested=True), Tile(64, 4, 3)):
        name = f"{tile.rows}w{tile.warps}{'n' if tile.nested else 'f'}"
        for chunk, cname in ((CHUNK, "chunk256"), (512, "chunk512"), (1 << 30, "onechunk")):
            rows[f"zkl/{name}/{cname}"] = lambda t=tile, c=chunk: prefill(
                q, k, v, pos, tile=t, chunk=c
            )
    for bm, bn, warps, stages in ((128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3),
                                  (64, 64, 4, 3), (128, 128, 8, 3)):  # fmt: skip
        for spec, chunk in ((False, 0), (True, 0), (True, CHUNK), (True, 512)):
            if chunk and (bn > KEY_BLOCK):
                continue
            kind = "plain" if not spec else (f"spec_chunk{chunk}" if chunk else "spec_onechunk")
            rows[f"{kind}/{bm}x{bn}w{warps}s{stages}"] = (
                lambda a=(bm, bn, warps, stages, spec, chunk): forward(q, k, v, *a)
            )
    results = {}
    for name, fn in rows.items():
        try:
            t = cuda_time(fn, repeats=10)
            results[name] = fn()
            out[f"{key}/{name}/over_sdpa_speed"] = sdpa / t
            out[f"{key}/{name}/tflops"] = flops / t / 1e12
        except Exception as exc:  # noqa: BLE001 - a tile this build refuses is a row too
            out[f"{key}/{name}/error"] = repr(exc)[:200]
        print(name, out.get(f"{key}/{name}/over_sdpa_speed"), flush=True)
    ref = F.scaled_dot_product_attention(qc, kr, vr, is_causal=True).float()
    for name, res in results.items():
        out[f"{key}/{name}/max_abs_vs_sdpa"] = (res.float() - ref).abs().max().item()
    pairs = [("spec_chunk256/128x64w8s3", "zkl/128w8f/chunk256"),
             ("spec_onechunk/128x64w8s3", "zkl/128w8f/onechunk"),
             ("spec_chunk256/64x64w4s3", "zkl/64w4f/chunk256"),
             ("spec_chunk512/128x64w8s3", "zkl/128w8f/chunk512"),
             ("zkl/128w8n/chunk256", "zkl/128w8f/chunk256")]  # fmt: skip
    for a, b in pairs:
        if a in results and b in results:
            out[f"{key}/equal/{a}=={b}"] = bool(torch.equal(results[a], results[b]))
    del results
    torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    main()

"""Which GEMM kernel forms and tiles are fast on a GPU, and which give the fixed tile's bits.

    python -m zkl.lab.gemm_tiles OUT.jsonl   (one JSON line per (shape, variant))

Variants: `ptr` (zkl's kernel, pointer loads) over many tiles; `tma` (TMA descriptor loads,
one tile per program); `tma_persist` (TMA, persistent over tiles); `splitk<S>` (K cut in S
fixed parts, summed in order: other bits, timed to know the price). Every time is 10 calls
replayed from one CUDA graph (`zkl.lab.timing.graph_time`), so small decode GEMMs are not
launch-bound. What it found chose `zkl.ops.triton.gemm.config_for`'s tiles (docs/gpu.md).
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from zkl.lab import timing
from zkl.ops.triton.gemm import (
    GROUP_M,
    fixed_config,
    gemm,
    gemm_tma_kernel,
    precision,
    sm_count,
    tile_coords,
    tma_tile,
)


@triton.jit(do_not_specialize=["M"])
def _tma_ws_kernel(
    x_desc,
    w_desc,
    o_desc,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    """zkl's persistent TMA kernel with its tile loop warp-specialized (zkl's does not)."""
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True, warp_specialize=True):
        pid_m, pid_n = tile_coords(tile, M, N, BM, BN, GROUP)
        tma_tile(x_desc, w_desc, o_desc, x_desc, pid_m, pid_n, N, K, False, "tf32", BM, BN, BK)


@triton.jit(do_not_specialize=["M"])
def _splitk_kernel(
    x_ptr, w_ptr, p_ptr, M, N, K, K_PART, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    part = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    k_lo = part * K_PART
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_lo, tl.minimum(k_lo + K_PART, K), BK):
        kk = k0 + offs_k
        a = tl.load(
            x_ptr + offs_m[:, None] * K + kk[None, :],
            mask=(offs_m[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            w_ptr + offs_n[None, :] * K + kk[:, None],
            mask=(kk[:, None] < K) & (offs_n[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    out = p_ptr + part * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _sum_parts_kernel(p_ptr, o_ptr, MN, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for part in tl.static_range(PARTS):
        acc += tl.load(p_ptr + part * MN + offs, mask=offs < MN, other=0.0)
    tl.store(o_ptr + offs, acc.to(o_ptr.dtype.element_ty), mask=offs < MN)


def tma(x, w, cfg, persist=False, ws=False):
    """TMA loads: zkl's own kernels (`persist` picks the persistent one, as zkl does for
    BLOCK_M >= 128), or the warp-specialized variant above."""
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    descs = (
        TensorDescriptor.from_tensor(x, [bm, bk]),
        TensorDescriptor.from_tensor(w, [bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]),
    )
    tiles, sms = triton.cdiv(m, bm) * triton.cdiv(n, bn), sm_count(x.device)
    launch = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=GROUP_M, num_warps=warps)
    if ws:
        _tma_ws_kernel[(min(sms, tiles),)](
            *descs,
            m,
            n,
            k,
            BM=bm,
            BN=bn,
            BK=bk,
            GROUP=GROUP_M,
            NUM_SMS=sms,
            num_warps=warps,
            num_stages=stages,
        )
    else:
        gemm_tma_kernel[(min(sms, tiles) if persist else tiles,)](
            *descs,
            x,
            m,
            n,
            k,
            HAS_BIAS=False,
            PRECISION=precision(x.dtype),
            NUM_SMS=sms,
            PERSISTENT=persist,
            num_stages=stages,
            **launch,
        )
    return out


def splitk(x, w, cfg, parts):
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    k_part = triton.cdiv(triton.cdiv(k, parts), bk) * bk
    p = torch.empty(parts, m, n, dtype=torch.float32, device=x.device)
    _splitk_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn), parts)](
        x, w, p, m, n, k, k_part, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages
    )
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _sum_parts_kernel[(triton.cdiv(m * n, 1024),)](p, out, m * n, PARTS=parts, BLOCK=1024)
    return out


def graph_time(fn) -> float:
    """Seconds per call: 10 calls captured in one CUDA graph, median of 3 replays."""
    return timing.graph_time(fn, calls=10, replays=3)


PTR = [
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (128, 128, 128, 8, 3),
    (128, 256, 128, 8, 2),
    (64, 256, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 32, 128, 4, 4),
    (64, 32, 256, 4, 3),
    (64, 16, 256, 4, 4),
    (64, 64, 256, 4, 3),
    (32, 64, 128, 4, 4),
    (16, 64, 128, 4, 4),
    (16, 32, 256, 4, 4),
]
TMA = [
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (128, 128, 64, 8, 4),
    (128, 128, 128, 8, 3),
    (128, 256, 128, 8, 2),
    (64, 128, 64, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 32, 256, 4, 4),
    (64, 16, 256, 4, 4),
]
SPLIT = [
    ((64, 64, 128, 4, 4), 2),
    ((64, 64, 128, 4, 4), 4),
    ((64, 128, 64, 4, 4), 4),
    ((64, 64, 128, 4, 4), 8),
]


def variants_for(x: torch.Tensor, w: torch.Tensor) -> list:
    """(name, callable) of every kernel form and tile timed at this shape."""
    big = x.shape[0] >= 4096  # small tiles only where M is small
    ptr = [c for c in PTR if not big or min(c[:2]) >= 64]
    out = [(f"ptr/{c}", lambda c=c: gemm(x, w, config=c)) for c in ptr]
    out += [(f"tma/{c}", lambda c=c: tma(x, w, c)) for c in TMA if not big or min(c[:2]) >= 64]
    out += [(f"tma_persist/{c}", lambda c=c: tma(x, w, c, persist=True)) for c in TMA[:5]]
    out += [(f"tma_ws/{c}", lambda c=c: tma(x, w, c, persist=True, ws=True)) for c in TMA[:3]]
    if x.shape[0] <= 256:
        out += [(f"splitk{p}/{c}", lambda c=c, p=p: splitk(x, w, c, p)) for c, p in SPLIT]
    return out


def explore(label: str, m: int, k: int, n: int, log) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    fixed = fixed_config(k, n, torch.bfloat16)
    ref = gemm(x, w, config=fixed)
    cublas = graph_time(lambda: torch.mm(x, w.t()))
    row = {
        "shape": label,
        "m": m,
        "k": k,
        "n": n,
        "cublas_us": cublas * 1e6,
        "fixed": "x".join(map(str, fixed)),
        "cublas_bitwise": torch.equal(torch.mm(x, w.t()), ref),
        "weight_gbs": n * k * 2 / cublas / 1e9,
    }
    log.write(json.dumps(row) + "\n")
    for name, fn in variants_for(x, w):
        rec = {"shape": label, "variant": name}
        try:
            seconds = graph_time(fn)
            got = fn()
            rec.update(
                us=seconds * 1e6,
                over_cublas=cublas / seconds,
                bitwise=torch.equal(got, ref),
                max_abs=float((got.float() - ref.float()).abs().max()),
            )
        except Exception as exc:  # noqa: BLE001 - a tile too big, an API missing
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        log.write(json.dumps(rec) + "\n")
        log.flush()
    print(label, f"cublas {cublas * 1e6:.1f}us", flush=True)


def main(path: str) -> None:
    h, inter, vocab = 1536, 8960, 151936
    layers = [
        ("qkv", h, 2048),
        ("o_proj", h, h),
        ("gate_up", h, 2 * inter),
        ("down", inter, h),
        ("lm_head", h, vocab),
    ]
    shapes = [("4096^3", 4096, 4096, 4096)]
    for m in (8192, 256, 64, 1):
        shapes += [(f"{name}_M{m}", m, k, n) for name, k, n in layers]
    with open(path, "w") as log:
        for shape in shapes:
            explore(*shape, log)


if __name__ == "__main__":
    main(sys.argv[1])

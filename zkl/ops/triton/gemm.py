"""`x @ w.T (+ b)` walking K in order, never split, with tiles chosen for the shape.

Why this kernel and not cuBLAS: cuBLAS picks its algorithm, split-K included, from M, so a
row's bits change with the batch. A GEMM that walks K in order without splitting it gives
each output the same bits whatever its tiling: measured on an H200 for every tile and form
here (pointer or TMA loads, one tile per program or persistent; `zkl.lab.gemm_tiles`,
docs/design.md section 4), and equal to no-split-K cuBLAS. So the tile may follow M, as a fast
GEMM's does, at no cost to invariance. Because that is a property of the device, it is
checked there: the first call of each (K, N, dtype, device) runs every tile and form that
shape can get against the fixed-tile reference (`tiles_agree`); if any bit differs, that
shape keeps one tile for every M (`fixed_config`) and a warning says so.
The backward is ordinary `torch.mm` (gradients are not compared bitwise).
"""

from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

try:  # TMA descriptors (Triton >= 3.4); without them every call takes the pointer form
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None

Config = tuple[int, int, int, int, int]  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)

# Tiles measured on an H200 (docs/benchmarks.md): a decode-sized M gets one 64-row tile and
# narrow N tiles, so a projection still spreads over the SMs without splitting K; a mid M
# gets 64x64 tiles or a persistent 128x128; a train M the persistent 128x256 (cuBLAS-level).
DECODE_SLIM = (64, 16, 256, 4, 4)  # M <= 64, N <= 1536 (o_proj, down at the 1.5B)
DECODE_NARROW = (64, 32, 256, 4, 4)  # M <= 64, N <= 4096 (fused q/k/v)
DECODE_MID = (64, 64, 128, 4, 4)  # M <= 64, N <= 16384; M <= 512, N <= 4096
DECODE_WIDE = (64, 64, 64, 4, 4)  # M <= 64, wide N (fused gate/up, lm_head)
MID_WIDE = (128, 128, 128, 8, 3)  # 64 < M <= 512, N > 4096
TRAIN = (128, 256, 64, 8, 3)  # M > 512
FP32 = (32, 64, 32, 4, 2)  # IEEE fp32 (the router, fixed): no TF32
# The fallback where the device's bits follow the tile: one config per (K, N), never by M.
SMALL_16 = (64, 128, 64, 4, 3)
LARGE_16 = (128, 256, 64, 8, 3)
LARGE_MIN = 1024
SLIM_COLS = 1536  # up to this N a decode GEMM takes 16-column tiles (more programs)
DECODE_ROWS = 64  # up to this M: one row tile (decode batches)
MID_ROWS = 512  # up to this M: mid tiles (large decode batches, short prefill chunks)
GROUP_M = 8
PROBE_ROWS = 192  # rows of the first-use check: a partial row tile at every BLOCK_M
PROBE_COLS = 512  # weight rows it needs: a column's bits do not depend on N


def fixed_config(depth: int, width: int, dtype: torch.dtype) -> Config:
    """The one tile of a GEMM with K = `depth`, N = `width` for every M: the reference."""
    if dtype == torch.float32:
        return FP32
    if dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"gemm supports bf16, fp16 and fp32, not {dtype}")
    return LARGE_16 if depth >= LARGE_MIN and width >= LARGE_MIN else SMALL_16


def config_for(rows: int, depth: int, width: int, dtype: torch.dtype) -> Config:
    """The tile for M = `rows` (fast); `tiles_agree` has shown its bits are the fixed tile's."""
    if dtype == torch.float32:
        return FP32
    fixed_config(depth, width, dtype)  # the dtype check
    if rows <= DECODE_ROWS:
        if width <= SLIM_COLS:
            return DECODE_SLIM
        return DECODE_NARROW if width <= 4096 else DECODE_MID if width <= 16384 else DECODE_WIDE
    if rows <= MID_ROWS:
        return DECODE_MID if width <= 4096 else MID_WIDE
    return TRAIN


def _candidates(depth: int, width: int, dtype: torch.dtype) -> set[Config]:
    """Every tile `config_for` can give this (K, N): one M from each band."""
    return {config_for(rows, depth, width, dtype) for rows in (1, DECODE_ROWS + 1, MID_ROWS + 1)}


@triton.jit
def tile_coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """Grouped tile order (better L2 reuse): it changes which tile runs when, never the math."""
    num_m = tl.cdiv(M, BLOCK_M)
    per_group = GROUP * tl.cdiv(N, BLOCK_N)
    first_m = (tile // per_group) * GROUP
    group_rows = tl.minimum(num_m - first_m, GROUP)
    return first_m + (tile % per_group) % group_rows, (tile % per_group) // group_rows


@triton.jit
def tma_tile(
    x_desc,
    w_desc,
    o_desc,
    b_ptr,
    pid_m,
    pid_n,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,  # 'ieee' for fp32 (no TF32), 'tf32' (ignored) for bf16
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One output tile: K walked in order (the TMA zero-fills past the edges)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        b = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
        acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
    if HAS_BIAS:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    o_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(o_desc.dtype))


@triton.jit(do_not_specialize=["M"])
def gemm_tma_kernel(
    x_desc,
    w_desc,
    o_desc,
    b_ptr,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    NUM_SMS: tl.constexpr,
    PERSISTENT: tl.constexpr,
):
    """One tile a program, or PERSISTENT: one program per SM walking the tiles (no tail wave,
    the next tile's loads overlap)."""
    if PERSISTENT:
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
            pid_m, pid_n = tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP)
            tma_tile(
                x_desc,
                w_desc,
                o_desc,
                b_ptr,
                pid_m,
                pid_n,
                N,
                K,
                HAS_BIAS,
                PRECISION,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
    else:
        pid_m, pid_n = tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP)
        tma_tile(
            x_desc, w_desc, o_desc, b_ptr, pid_m, pid_n, N, K, HAS_BIAS, PRECISION,
            BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip


@triton.jit
def pointer_tile(
    x_rows,  # [BM, 1]: the tile's rows of x
    w_cols,  # [1, BN]: the tile's rows of the weight
    K,
    stride_xk,
    stride_wk,
    EVEN_K: tl.constexpr,  # K a multiple of BLOCK_K: no tail to mask
    PRECISION: tl.constexpr,  # 'ieee' for fp32 (no TF32), 'tf32' (ignored) for bf16
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One fp32 output tile: K walked in order, never split (the dense and the grouped
    kernel share it, so their rows agree)."""
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_rows + offs_k[None, :] * stride_xk
    w_ptrs = w_cols + offs_k[:, None] * stride_wk  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            a = tl.load(x_ptrs, mask=offs_k[None, :] < K - k0, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < K - k0, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def store_tile(out_ptr, acc, rows, cols, row_end, N, stride_om, stride_on):
    """Stores the tile's rows below `row_end` and columns below N, in the output's dtype."""
    out_rows = rows.to(tl.int64)
    out_ptrs = out_ptr + out_rows[:, None] * stride_om + cols[None, :] * stride_on
    mask = (rows[:, None] < row_end) & (cols[None, :] < N)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of BLOCK_K: no tail to mask
    PRECISION: tl.constexpr,  # 'ieee' for fp32 (no TF32), 'tf32' (ignored) for bf16
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
):
    pid_m, pid_n = tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows and columns read row/column 0 instead of being masked (their results
    # are never stored), so the loads stay unmasked and vectorized; only K's tail is masked.
    offs_m = tl.where(rows < M, rows, 0).to(tl.int64)  # M * K may pass 2^31
    offs_n = tl.where(cols < N, cols, 0)
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    w_cols = w_ptr + offs_n[None, :] * stride_wn
    acc = pointer_tile(
        x_rows, w_cols, K, stride_xk, stride_wk, EVEN_K, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K
    )
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n).to(tl.float32)[None, :]
    store_tile(out_ptr, acc, rows, cols, M, N, stride_om, stride_on)


_SM_COUNT: dict[int, int] = {}
_AGREES: dict[tuple, bool] = {}


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter's CPU tensors
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """TMA needs Hopper or later, 16-byte aligned bases and row strides, unit inner stride."""
    if TensorDescriptor is None:
        return False
    if tensors[0].is_cuda and torch.cuda.get_device_capability(tensors[0].device)[0] < 9:
        return False
    return all(
        t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
        for t in tensors
    )


def precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input precision: IEEE for fp32 (Triton's default there is TF32, which would
    round the fp32 path's inputs to 10 bits of mantissa), ignored for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _launch(x, weight, bias, out, config: Config, tma: bool) -> None:
    block_m, block_n, block_k, warps, stages = config
    num_rows, depth = x.shape
    num_cols = weight.shape[0]
    tiles = triton.cdiv(num_rows, block_m) * triton.cdiv(num_cols, block_n)
    bias_arg = bias if bias is not None else x
    if tma:
        descs = (
            TensorDescriptor.from_tensor(x, [block_m, block_k]),
            TensorDescriptor.from_tensor(weight, [block_n, block_k]),
            TensorDescriptor.from_tensor(out, [block_m, block_n]),
        )
        persistent = block_m >= 128  # the large tiles: measured faster at every shape
        sms = sm_count(x.device)
        gemm_tma_kernel[(min(sms, tiles) if persistent else tiles,)](
            *descs,
            bias_arg,
            num_rows,
            num_cols,
            depth,
            HAS_BIAS=bias is not None,
            PRECISION=precision(x.dtype),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            GROUP=GROUP_M,
            NUM_SMS=sms,
            PERSISTENT=persistent,
            num_warps=warps,
            num_stages=stages,
        )
        return
    _gemm_kernel[(tiles,)](
        x,
        weight,
        bias_arg,
        out,
        num_rows,
        num_cols,
        depth,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        out.stride(1),
        HAS_BIAS=bias is not None,
        EVEN_K=depth % block_k == 0,
        PRECISION=precision(x.dtype),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP=GROUP_M,
        num_warps=warps,
        num_stages=stages,
    )


def _product(x, weight, bias, config: Config, tma: bool) -> torch.Tensor:
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if x.shape[0] and weight.shape[0]:
        _launch(x, weight, bias, out, config, tma and _tma_ok(x, weight, out))
    return out


def _probe_inputs(
    depth: int, cols: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded x [PROBE_ROWS, K] and a weight [cols, K] for the first-use bit checks."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(PROBE_ROWS, depth, generator=g, device=device).to(dtype)
    w = (torch.randn(cols, depth, generator=g, device=device) * 0.05).to(dtype)
    return x, w


def tiles_agree(
    depth: int,
    width: int,
    dtype: torch.dtype,
    device: torch.device,
    extra: tuple[Config, ...] = (),
) -> bool:
    """Whether every tile and form a (K, N) GEMM can get gives the fixed tile's bits here,
    and the `extra` tiles too (pointer form: the grouped MoE kernel's own tiles).

    Checked once per (K, N, dtype, device, extra), eagerly on seeded inputs (never while a
    CUDA graph is being captured: then the fixed tile is used and nothing is cached). fp32
    has one tile.
    """
    key = (depth, width, dtype, str(device), extra)
    if key in _AGREES:
        return _AGREES[key]
    if dtype == torch.float32:
        return True
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return False
    x, w = _probe_inputs(depth, min(width, PROBE_COLS), dtype, device, seed=0)
    reference = _product(x, w, None, fixed_config(depth, width, dtype), tma=False)
    forms = [(c, tma) for c in _candidates(depth, width, dtype) for tma in (False, True)]
    forms += [(c, False) for c in extra]
    agree = all(torch.equal(_product(x, w, None, c, tma), reference) for c, tma in forms)
    if not agree:
        warnings.warn(
            f"zkl: on this device the GEMM's bits follow its tile at K={depth}, N={width} "
            f"({dtype}); that shape keeps one tile for every batch size (slower, still exact)",
            stacklevel=3,
        )
    _AGREES[key] = agree
    return agree


def gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Config | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias [N]) -> [M, N] in x's dtype, fp32 accumulation.

    `config` overrides the tile (the bench times candidates and checks their bits against
    `fixed_config`'s); the model path never passes one.
    """
    if x.dtype != weight.dtype:
        raise TypeError(f"gemm needs one dtype, got {x.dtype} and {weight.dtype}")
    num_rows, depth = x.shape
    width = weight.shape[0]
    if config is None:
        fast = tiles_agree(depth, width, x.dtype, x.device)
        config = (
            config_for(num_rows, depth, width, x.dtype)
            if fast
            else fixed_config(depth, width, x.dtype)
        )
    return _product(x, weight, bias, config, tma=True)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return gemm(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_w = grad.t() @ x if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear` on the invariant GEMM; x [..., K] (made contiguous once), differentiable."""
    flat = x.reshape(-1, x.shape[-1])
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    out = _Linear.apply(flat, weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])

"""`x @ w.T (+ b)` with a tile configuration fixed by (K, N, dtype) and K walked in order.

Why this kernel and not cuBLAS: cuBLAS picks its algorithm (and split-K) from M, so a row's
bits change with the batch. Measured on an H200 (DESIGN.md section 4): a GEMM that walks K
in order without splitting it gives the same bits whatever its M tiling, and equals
no-split-K cuBLAS. Here the tiles are fixed, so the only thing M changes is how many tiles
run. The backward is ordinary `torch.mm` (gradients are not compared bitwise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): chosen by (K, N, dtype), never by M,
# so a row's bits cannot change with the batch; the train and the gen path share each shape's.
SMALL_16 = (64, 128, 64, 4, 3)  # 16-bit inputs, narrow or shallow weights
LARGE_16 = (128, 256, 64, 8, 3)  # 16-bit inputs, K and N >= 1024 (Triton's Hopper tutorial tile)
FP32 = (32, 64, 32, 4, 2)  # IEEE fp32 (the router): no TF32
LARGE_MIN = 1024
GROUP_M = 8


def config_for(depth: int, width: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """The tile config of a GEMM with K = `depth`, N = `width`: a function of the weight only."""
    if dtype == torch.float32:
        return FP32
    if dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"gemm supports bf16, fp16 and fp32, not {dtype}")
    return LARGE_16 if depth >= LARGE_MIN and width >= LARGE_MIN else SMALL_16


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
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # Grouped tile order (better L2 reuse); it changes which tile runs when, never the math.
    per_group = GROUP * num_n
    first_m = (pid // per_group) * GROUP
    group_rows = tl.minimum(num_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows and columns read row/column 0 instead of being masked (their results
    # are never stored), so the loads stay unmasked and vectorized; only K's tail is masked.
    offs_m = tl.where(rows < M, rows, 0).to(tl.int64)  # M * K may pass 2^31
    offs_n = tl.where(cols < N, cols, 0)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk  # [BK, BN]
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
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n).to(tl.float32)[None, :]
    out_rows = rows.to(tl.int64)
    out_ptrs = out_ptr + out_rows[:, None] * stride_om + cols[None, :] * stride_on
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: tuple[int, int, int, int, int] | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias [N]) -> [M, N] in x's dtype, fp32 accumulation.

    `config` overrides the tile config (the bench times candidates and checks their bits
    against `config_for`'s); the model path never passes one.
    """
    if x.dtype != weight.dtype:
        raise TypeError(f"gemm needs one dtype, got {x.dtype} and {weight.dtype}")
    num_rows, depth = x.shape
    num_cols = weight.shape[0]
    out = torch.empty(num_rows, num_cols, dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    block_m, block_n, block_k, warps, stages = config or config_for(depth, num_cols, x.dtype)
    grid = (triton.cdiv(num_rows, block_m) * triton.cdiv(num_cols, block_n),)
    _gemm_kernel[grid](
        x,
        weight,
        bias if bias is not None else x,
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
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP=GROUP_M,
        num_warps=warps,
        num_stages=stages,
    )
    return out


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

"""The MoE experts' GEMMs as one launch that reads its group offsets from device memory.

Rows of x are grouped by expert (group e is rows offsets[e]:offsets[e + 1]); group e is
multiplied by expert e's weight [N, K]. The grid is sized from what the host knows without
reading the device: the total row count, the number of experts and the tile. Each program
finds its expert and row tile from the offsets in device memory and returns at once when it
has none, so a decode step with MoE layers holds no host sync and a CUDA graph can capture it.

Each expert keeps its own weight tensor (the model's state-dict names stay per expert): the
kernel reads a device table of their addresses, so nothing is stacked or copied.

Invariance: a tile walks K in order, never split, with the inner loop of the dense GEMM
(`zkl.ops.triton.gemm.pointer_tile`), so a row's result never depends on the group sizes and
equals the dense invariant GEMM's row where that GEMM's tiles agree (`gemm.tiles_agree`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from zkl.ops.triton.gemm import (
    Config,
    config_for,
    fixed_config,
    pointer_tile,
    precision,
    store_tile,
    tiles_agree,
)

_TABLES: dict[tuple, torch.Tensor] = {}  # weight address tables, by (device, addresses)
# Measured on an H200 (docs/benchmarks.md, zkl.lab.grouped_tiles): while the groups are
# decode-sized (a few rows an expert), 16-row tiles waste the least MMA work and read each
# expert's weight at the highest rate; 1.5x faster than 64-row tiles at Qwen3-30B-A3B's shapes.
SMALL_GROUPS = (16, 64, 128, 4, 4)
SMALL_GROUP_ROWS = 64  # up to this mean group size, SMALL_GROUPS


@triton.jit(do_not_specialize=["M"])
def _grouped_gemm_kernel(
    x_ptr,
    w_table,  # int64 [E]: each expert's weight address
    offsets_ptr,  # int [E + 1]: group e is rows offsets[e]:offsets[e + 1]
    out_ptr,
    M,
    N,
    K,
    E,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,  # a power of two > E
):
    num_n = tl.cdiv(N, BLOCK_N)
    tile_m = tl.program_id(0) // num_n
    pid_n = tl.program_id(0) % num_n
    # Which expert owns row tile `tile_m`: groups take cdiv(rows, BLOCK_M) tiles each, in order.
    experts = tl.arange(0, BLOCK_E)
    starts = tl.load(offsets_ptr + experts, mask=experts < E, other=0)
    ends = tl.load(offsets_ptr + experts + 1, mask=experts < E, other=0)
    tiles = (ends - starts + BLOCK_M - 1) // BLOCK_M
    tile_ends = tl.cumsum(tiles, 0)
    expert = tl.sum((tile_ends <= tile_m).to(tl.int32), 0)
    if expert >= E:  # past the last tile: the grid covers a bound, not the exact count
        return
    first_tile = tl.sum(tl.where(experts < expert, tiles, 0), 0)
    group_start = tl.sum(tl.where(experts == expert, starts, 0), 0)
    group_end = tl.sum(tl.where(experts == expert, ends, 0), 0)
    w_ptr = tl.load(w_table + expert).to(tl.pointer_type(x_ptr.dtype.element_ty))

    rows = group_start + (tile_m - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # As the dense kernel: rows and columns past the edge read the group's first row / column
    # 0 (never stored), so the loads stay unmasked; only K's tail is masked.
    offs_m = tl.where(rows < group_end, rows, group_start).to(tl.int64)
    offs_n = tl.where(cols < N, cols, 0)
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    w_cols = w_ptr + offs_n[None, :] * stride_wn
    acc = pointer_tile(
        x_rows, w_cols, K, stride_xk, stride_wk, EVEN_K, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K
    )
    store_tile(out_ptr, acc, rows, cols, group_end, N, stride_om, stride_on)


def address_table(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """The weights' addresses as an int64 device tensor, built once per set of addresses.

    A table holds nothing but the addresses it is keyed by, so a cached one is never stale.
    Tables are kept for the life of the process: a captured CUDA graph reads a table's
    address at every replay (and they are small: 8 bytes an expert, one set per projection
    whose weights were ever allocated). Built eagerly; a graph's warm-up builds it.
    """
    device = weights[0].device
    key = (str(device), *(w.data_ptr() for w in weights))
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = torch.tensor(key[1:], dtype=torch.int64, device=device)
    return table


def row_tile_bound(rows: int, num_experts: int, block_m: int) -> int:
    """Row tiles enough for any split of `rows` rows into `num_experts` groups."""
    return triton.cdiv(rows, block_m) + min(num_experts, rows)


def grouped_gemm(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    offsets: torch.Tensor,
    config: Config,
    transpose: bool = False,
) -> torch.Tensor:
    """x [M, K] grouped at `offsets` [E + 1] (on x's device) -> [M, N]: group e @ weights[e].T.

    `transpose`: each weight is [K, N] read as its transpose, i.e. group e @ weights[e]
    (the input gradient). Every weight has one shape and x's dtype; fp32 accumulation.
    """
    num_rows, depth = x.shape
    first = weights[0]
    if any(
        w.dtype != x.dtype or w.shape != first.shape or w.stride() != first.stride()
        for w in weights
    ):
        raise TypeError("grouped_gemm needs the experts' weights in one shape, layout and dtype")
    stride_wn, stride_wk = first.stride()
    if transpose:
        stride_wn, stride_wk = stride_wk, stride_wn
    width = first.shape[1] if transpose else first.shape[0]
    out = torch.empty(num_rows, width, dtype=x.dtype, device=x.device)
    if num_rows == 0 or width == 0:
        return out
    block_m, block_n, block_k, warps, stages = config
    num_experts = len(weights)
    grid = row_tile_bound(num_rows, num_experts, block_m) * triton.cdiv(width, block_n)
    _grouped_gemm_kernel[(grid,)](
        x,
        address_table(weights),
        offsets,
        out,
        num_rows,
        width,
        depth,
        num_experts,
        x.stride(0),
        x.stride(1),
        stride_wn,
        stride_wk,
        out.stride(0),
        out.stride(1),
        EVEN_K=depth % block_k == 0,
        PRECISION=precision(x.dtype),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        BLOCK_E=triton.next_power_of_2(num_experts + 1),
        num_warps=warps,
        num_stages=stages,
        enable_fp_fusion=False,  # one rounding per operation, as the dense kernels (docs/gpu.md)
    )
    return out


class _GroupedLinear(torch.autograd.Function):
    """Forward on the grouped kernel; backward: the input gradient on the same kernel over the
    transposed weights, each weight gradient an ordinary GEMM (not compared bitwise)."""

    @staticmethod
    def forward(ctx, x, offsets, config, *weights):
        ctx.save_for_backward(x, offsets, *weights)
        ctx.config = config
        return grouped_gemm(x, weights, offsets, config)

    @staticmethod
    def backward(ctx, grad):
        x, offsets, *weights = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = None
        if ctx.needs_input_grad[0]:
            depth = x.shape[1]
            config = config_for(grad.shape[0], grad.shape[1], depth, grad.dtype)
            grad_x = grouped_gemm(grad, weights, offsets, config, transpose=True)
        bounds = offsets.tolist()  # the backward is eager: one host read of the group sizes
        grad_w = [
            grad[lo:hi].t() @ x[lo:hi] if needed else None
            for needed, lo, hi in zip(ctx.needs_input_grad[3:], bounds[:-1], bounds[1:])
        ]
        return (grad_x, None, None, *grad_w)


def _apply(x, weights, offsets, config) -> torch.Tensor:
    return _GroupedLinear.apply(x.contiguous(), offsets, config, *weights)


def grouped_linear(
    x: torch.Tensor, weights: Sequence[torch.Tensor], offsets: torch.Tensor
) -> torch.Tensor:
    """The invariant form: each group's rows equal the dense invariant GEMM's (`gemm.linear`)
    rows of the same expert, whatever the other groups hold."""
    num_rows, depth = x.shape
    width = weights[0].shape[0]
    config = group_tile(num_rows, len(weights), depth, width, x.dtype)
    if not tiles_agree(depth, width, x.dtype, x.device, extra=(SMALL_GROUPS,)):
        config = fixed_config(depth, width, x.dtype)
    return _apply(x, weights, offsets, config)


def group_tile(rows: int, num_experts: int, depth: int, width: int, dtype: torch.dtype) -> Config:
    """The tile for `rows` rows over `num_experts` groups: 16-row tiles while the mean group
    is decode-sized, else the dense GEMM's tile for that many rows."""
    if dtype != torch.float32 and rows <= SMALL_GROUP_ROWS * num_experts:
        return SMALL_GROUPS
    return config_for(rows, depth, width, dtype)


def grouped_linear_default(
    x: torch.Tensor, weights: Sequence[torch.Tensor], offsets: torch.Tensor
) -> torch.Tensor:
    """The default form (a fast generator's fused MoE GEMM): the tile follows the total row
    count, with no first-use check of what that does to a row's bits."""
    num_rows, depth = x.shape
    tile = group_tile(num_rows, len(weights), depth, weights[0].shape[0], x.dtype)
    return _apply(x, weights, offsets, tile)

"""Fused elementwise passes of a decoder layer: RoPE (+ the KV-cache write), SiLU-mul, and
the residual add + RMSNorm.

A decode step is mostly small kernels: unfused, RoPE alone is nine (gathers, casts, a cat,
multiplies) and the cache write two more. Each kernel here does one such chain in one pass
and keeps its arithmetic per element, so no result depends on the launch shape:
- RoPE is exactly torch's `x * cos + rotate_half(x) * sin` (mul, mul, add, each rounded;
  `enable_fp_fusion=False` forbids the compiler a fused multiply-add), so the fused pass and
  the torch form give the same bits (a GPU test checks it).
- SiLU-mul is torch's two-kernel arithmetic (silu in fp32 rounded to the activation dtype,
  then the product rounded), but the exponential is Triton's, so on CUDA it is the one form
  every path runs: forward here, backward by PyTorch on the saved inputs.
- add + RMSNorm rounds the sum to the activation dtype first and then runs the very
  reduction of `rowwise._rms_norm_kernel` (same block, same warps), so it gives the bits of
  the unfused add and norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from zkl.ops.triton.rowwise import NORM_WARPS, _rms_normalize, row_matrix

ELEMENTWISE_BLOCK = 1024


@triton.jit
def _rotate_heads(src, dst, half, mask, c1, c2, s1, s2):
    """dst = src * cos + rotate_half(src) * sin for a [heads, half] tile of both halves."""
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * c1 + (-x2) * s1
    out2 = x2 * c2 + x1 * s2
    dtype = src.dtype.element_ty  # round to the input dtype first, as torch's `.to(x.dtype)`
    tl.store(dst, out1.to(dtype).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + half, out2.to(dtype).to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    slots_ptr,
    cos_ptr,
    sin_ptr,
    qo_ptr,
    ko_ptr,
    vo_ptr,
    seq,
    s_qb,
    s_qt,
    s_qh,
    s_kb,
    s_kt,
    s_kh,
    s_vb,
    s_vt,
    s_vh,
    s_pb,
    s_pt,
    s_qob,
    s_qot,
    s_qoh,
    s_kor,
    s_koh,
    s_kot,
    s_vor,
    s_voh,
    s_vot,
    s_table,
    num_q_heads,
    num_kv_heads,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    TO_CACHE: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // seq).to(tl.int64)
    t = (pid % seq).to(tl.int64)
    pos = tl.load(pos_ptr + b * s_pb + t * s_pt).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    d_ok = d < HALF
    row = cos_ptr + pos * s_table
    c1 = tl.load(row + d, mask=d_ok, other=0.0)[None, :]
    c2 = tl.load(row + HALF + d, mask=d_ok, other=0.0)[None, :]
    row = sin_ptr + pos * s_table
    s1 = tl.load(row + d, mask=d_ok, other=0.0)[None, :]
    s2 = tl.load(row + HALF + d, mask=d_ok, other=0.0)[None, :]

    qh = tl.arange(0, BLOCK_QH)[:, None]
    mask = (qh < num_q_heads) & d_ok[None, :]
    src = q_ptr + b * s_qb + t * s_qt + qh * s_qh + d[None, :]
    dst = qo_ptr + b * s_qob + t * s_qot + qh * s_qoh + d[None, :]
    _rotate_heads(src, dst, HALF, mask, c1, c2, s1, s2)

    # K (and V, into the cache) go to row `slots[b]` at the token's position, or to row b
    # at its index in the sequence.
    kv_row = b
    kv_t = t
    if TO_CACHE:
        kv_row = tl.load(slots_ptr + b).to(tl.int64)
        kv_t = pos
    kh = tl.arange(0, BLOCK_KH)[:, None]
    mask = (kh < num_kv_heads) & d_ok[None, :]
    src = k_ptr + b * s_kb + t * s_kt + kh * s_kh + d[None, :]
    dst = ko_ptr + kv_row * s_kor + kv_t * s_kot + kh * s_koh + d[None, :]
    _rotate_heads(src, dst, HALF, mask, c1, c2, s1, s2)
    if TO_CACHE:
        src = v_ptr + b * s_vb + t * s_vt + kh * s_vh + d[None, :]
        dst = vo_ptr + kv_row * s_vor + kv_t * s_vot + kh * s_voh + d[None, :]
        for part in tl.static_range(2):
            value = tl.load(src + part * HALF, mask=mask, other=0.0)
            tl.store(dst + part * HALF, value.to(dst.dtype.element_ty), mask=mask)


def _check_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> None:
    head_dim = q.shape[-1]
    if q.stride(-1) != 1 or k.stride(-1) != 1 or head_dim % 2 or k.shape[-1] != head_dim:
        raise ValueError("rotary needs q, k [B, T, H, D] with a unit stride on an even D")
    if cos.shape[-1] != head_dim or cos.stride(-1) != 1:
        raise ValueError(f"rotary tables of width {cos.shape[-1]} do not fit head_dim {head_dim}")


def _launch_rotary(q, k, v, positions, slots, cos, sin, q_out, k_dst, v_dst, to_cache: bool):
    batch, seq, num_q_heads, head_dim = q.shape
    if batch * seq == 0:
        return
    half = head_dim // 2
    # without a cache V stays where it is: the V arguments then only fill the signature
    v_src = v if to_cache else k
    v_out = v_dst if to_cache else k_dst
    kv_strides = (k_dst.stride(0), k_dst.stride(1), k_dst.stride(2))
    v_strides = (v_out.stride(0), v_out.stride(1), v_out.stride(2))
    if not to_cache:  # [B, T, H, D] outputs: (row, head, token) strides
        kv_strides = (k_dst.stride(0), k_dst.stride(2), k_dst.stride(1))
        v_strides = kv_strides
    _rotary_kernel[(batch * seq,)](
        q,
        k,
        v_src,
        positions,
        slots if to_cache else positions,
        cos,
        sin,
        q_out,
        k_dst,
        v_out,
        seq,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v_src.stride(0),
        v_src.stride(1),
        v_src.stride(2),
        positions.stride(0),
        positions.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        q_out.stride(2),
        *kv_strides,
        *v_strides,
        cos.stride(0),
        num_q_heads,
        k.shape[2],
        HALF=half,
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_QH=triton.next_power_of_2(num_q_heads),
        BLOCK_KH=triton.next_power_of_2(k.shape[2]),
        TO_CACHE=to_cache,
        num_warps=4,
        enable_fp_fusion=False,  # mul, mul, add each rounded, as torch computes them
    )


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, Hq, D], k [B, T, Hkv, D] rotated at positions [B, T] -> new [B, T, H, D]."""
    _check_rotary(q, k, cos)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    _launch_rotary(q, k, None, positions, None, cos, sin, q_out, k_out, None, False)
    return q_out, k_out


def rotary_into_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Rotated q [B, T, Hq, D] out; rotated k and v written to cache_k/v [S, Hkv, L, D] at
    row slots[b], position positions[b, t]: one pass instead of RoPE's and index_put's."""
    _check_rotary(q, k, cos)
    if v.stride(-1) != 1 or cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1:
        raise ValueError("rotary_into_cache needs a unit stride on the head dim")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    slots = slots.contiguous()
    _launch_rotary(q, k, v, positions, slots, cos, sin, q_out, cache_k, cache_v, True)
    return q_out


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, cols, s_g, s_u, s_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < cols
    g = tl.load(gate_ptr + row * s_g + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * s_u + offs, mask=mask, other=0.0)
    dtype = out_ptr.dtype.element_ty
    silu = (g / (1.0 + tl.exp(-g))).to(dtype)  # rounded, as torch's silu output would be
    out = (silu.to(tl.float32) * u.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * s_o + offs, out, mask=mask)


def silu_mul_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"silu_mul needs gate and up alike, got {gate.shape} and {up.shape}")
    cols = gate.shape[-1]
    g, u = row_matrix(gate), row_matrix(up)
    out = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
    if out.numel():
        grid = (g.shape[0], triton.cdiv(cols, ELEMENTWISE_BLOCK))
        _silu_mul_kernel[grid](
            g, u, out, cols, g.stride(0), u.stride(0), out.stride(0), BLOCK=ELEMENTWISE_BLOCK
        )
    return out.reshape(gate.shape)


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return silu_mul_forward(gate, up)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        with torch.enable_grad():
            g, u = gate.detach().requires_grad_(), up.detach().requires_grad_()
            return torch.autograd.grad(F.silu(g) * u, (g, u), grad)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in one pass; differentiable (PyTorch's backward on the saved inputs)."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluMul.apply(gate, up)
    return silu_mul_forward(gate, up)


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, delta_ptr, w_ptr, sum_ptr, out_ptr, s_x, s_d, s_s, s_o, dim, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0).to(tl.float32)
    delta = tl.load(delta_ptr + row * s_d + cols, mask=mask, other=0.0).to(tl.float32)
    total = (x + delta).to(sum_ptr.dtype.element_ty)  # the residual stream, rounded
    tl.store(sum_ptr + row * s_s + cols, total, mask=mask)
    normed = _rms_normalize(total.to(tl.float32), w_ptr, cols, mask, dim, eps)
    tl.store(out_ptr + row * s_o + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, fp_fusion: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)) in one pass: forward only (the gen path's).
    `fp_fusion`: the default path's contraction (`rowwise.rms_norm_forward`)."""
    if x.shape != delta.shape or x.dtype != delta.dtype:
        raise ValueError(f"add_rms_norm needs x and delta alike, got {x.shape} and {delta.shape}")
    dim = x.shape[-1]
    xs, ds = row_matrix(x), row_matrix(delta)
    total = torch.empty(xs.shape, dtype=x.dtype, device=x.device)
    out = torch.empty_like(total)
    if xs.shape[0]:
        _add_rms_norm_kernel[(xs.shape[0],)](
            xs,
            ds,
            weight,
            total,
            out,
            xs.stride(0),
            ds.stride(0),
            total.stride(0),
            out.stride(0),
            dim,
            eps,
            BLOCK=triton.next_power_of_2(dim),
            num_warps=NORM_WARPS,
            enable_fp_fusion=fp_fusion,  # zero mode: one rounding per operation (docs/gpu.md)
        )
    return total.reshape(x.shape), out.reshape(x.shape)

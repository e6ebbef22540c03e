"""Row reductions with one program per row and a fixed block walk: RMSNorm and logprobs.

A row's sum is a `tl.sum` over blocks of a fixed width visited in order, so its bits depend
on the row alone, never on how many rows the launch has. The vocab's log-sum-exp cuts the
row into LOGPROB_PARTS fixed parts (a function of V only) walked in parallel, then folds the
parts by one fixed tree: one program per row left a decode batch's 64 rows on 64 SMs.
The backward passes are ordinary PyTorch (RMSNorm) or a plain elementwise kernel
(logprobs), as gradients are not compared.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOGPROB_BLOCK = 4096  # vocab elements per step of the online log-sum-exp
LOGPROB_PARTS = 8  # fixed parts of a row's vocab, reduced in parallel, folded in one tree
NORM_WARPS = 4
LOGPROB_WARPS = 8


@triton.jit
def _rms_normalize(x, w_ptr, cols, mask, dim, eps):
    """fp32 row x [BLOCK] -> x * rstd * w: the one RMSNorm body (the fused add + norm's too)."""
    mean_sq = tl.sum(x * x, axis=0) / dim
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return x * rstd * w


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_out, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    out = _rms_normalize(x, w_ptr, cols, mask, dim, eps)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask)


def _rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def row_matrix(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as [rows, D] with a unit last stride (a view where it can be): what the
    one-program-per-row kernels index as `ptr + row * stride(0) + col`."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm_forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float, fp_fusion: bool = False
) -> torch.Tensor:
    """One program a row. `fp_fusion` lets the compiler contract mul + add (the default
    path's, as a fast generator compiles it); zero mode's rounds once per operation."""
    dim = x.shape[-1]
    rows = row_matrix(x)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(dim)
        _rms_norm_kernel[(rows.shape[0],)](
            rows,
            weight,
            out,
            rows.stride(0),
            out.stride(0),
            dim,
            eps,
            BLOCK=block,
            num_warps=NORM_WARPS,
            enable_fp_fusion=fp_fusion,  # zero mode: one rounding per operation (docs/gpu.md)
        )
    return out.reshape(x.shape)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, fp_fusion):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return rms_norm_forward(x, weight, eps, fp_fusion)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        with torch.enable_grad():
            xd, wd = x.detach().requires_grad_(), weight.detach().requires_grad_()
            out = _rms_norm_eager(xd, wd, ctx.eps)
            gx, gw = torch.autograd.grad(out, (xd, wd), grad)
        return gx, gw, None, None


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, fp_fusion: bool = False
) -> torch.Tensor:
    """RMSNorm over the last dim: fp32 statistics, output in x's dtype; differentiable
    (PyTorch's backward on the saved input)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _RMSNorm.apply(x, weight, eps, fp_fusion)
    return rms_norm_forward(x, weight, eps, fp_fusion)


def rms_norm_default(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The default path's RMSNorm: the same one-program-a-row pass, contracted as a fast
    generator compiles it (a row-wise norm needs no invariance fix; fast generators fuse it)."""
    return rms_norm(x, weight, eps, fp_fusion=True)


@triton.jit
def _logprob_part_kernel(
    logits_ptr,
    temp_ptr,
    m_ptr,
    s_ptr,
    inner,
    stride_outer,
    stride_inner,
    vocab,
    per_part,
    PARTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The online log-sum-exp (max, scaled sum) of one fixed part of one row's vocab."""
    row = tl.program_id(0).to(tl.int64)  # rows * vocab passes 2^31
    part = tl.program_id(1)
    base = logits_ptr + (row // inner) * stride_outer + (row % inner) * stride_inner
    temp = tl.load(temp_ptr + row)
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full((BLOCK,), float("-inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros((BLOCK,), tl.float32), axis=0)
    lo = part * per_part
    hi = tl.minimum(lo + per_part, vocab)
    for start in range(lo, hi, BLOCK):
        mask = start + cols < hi
        x = tl.load(base + start + cols, mask=mask, other=float("-inf")).to(tl.float32) / temp
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    tl.store(m_ptr + row * PARTS + part, m)
    tl.store(s_ptr + row * PARTS + part, s)


@triton.jit
def _logprob_combine_kernel(
    logits_ptr,
    tokens_ptr,
    temp_ptr,
    m_ptr,
    s_ptr,
    out_ptr,
    lse_ptr,
    inner,
    stride_outer,
    stride_inner,
    PARTS: tl.constexpr,
):
    """The parts' (max, sum) folded by one fixed tree, then the token's logprob."""
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + (row // inner) * stride_outer + (row % inner) * stride_inner
    parts = tl.arange(0, PARTS)
    m_parts = tl.load(m_ptr + row * PARTS + parts)
    s_parts = tl.load(s_ptr + row * PARTS + parts)
    m = tl.max(m_parts, axis=0)
    scale = tl.where(m_parts == float("-inf"), 0.0, tl.exp(m_parts - m))  # empty parts add 0
    lse = m + tl.log(tl.sum(s_parts * scale, axis=0))
    temp = tl.load(temp_ptr + row)
    token = tl.load(tokens_ptr + row)
    picked = tl.load(base + token).to(tl.float32) / temp
    tl.store(out_ptr + row, picked - lse)
    tl.store(lse_ptr + row, lse)


@triton.jit
def _logprob_grad_kernel(
    logits_ptr,
    tokens_ptr,
    temp_ptr,
    lse_ptr,
    grad_ptr,
    dlogits_ptr,
    inner,
    stride_outer,
    stride_inner,
    d_stride_outer,
    d_stride_inner,
    vocab,
    BLOCK: tl.constexpr,
):
    """d lp / d logits = (onehot(token) - softmax(logits / T)) / T, times the incoming grad."""
    row = tl.program_id(0).to(tl.int64)
    offset = (row // inner) * stride_outer + (row % inner) * stride_inner
    d_offset = (row // inner) * d_stride_outer + (row % inner) * d_stride_inner
    temp = tl.load(temp_ptr + row)
    lse = tl.load(lse_ptr + row)
    g = tl.load(grad_ptr + row)
    token = tl.load(tokens_ptr + row)
    cols = tl.arange(0, BLOCK)
    for start in range(0, vocab, BLOCK):
        idx = start + cols
        mask = idx < vocab
        x = tl.load(logits_ptr + offset + idx, mask=mask, other=0.0).to(tl.float32) / temp
        d = (tl.where(idx == token, 1.0, 0.0) - tl.exp(x - lse)) * (g / temp)
        tl.store(dlogits_ptr + d_offset + idx, d.to(dlogits_ptr.dtype.element_ty), mask=mask)


def _as_rows(logits: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """logits [..., V] with a unit last stride -> (tensor, inner count, outer and inner strides).

    Row r sits at (r // inner) * stride_outer + (r % inner) * stride_inner, which covers a
    sliced [B, T-1, V] view of [B, T, V] logits without copying it.
    """
    if logits.stride(-1) != 1 or logits.dim() > 3:
        logits = logits.reshape(-1, logits.shape[-1]).contiguous()
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    if logits.dim() == 2:
        return logits, 1, logits.stride(0), 0
    return logits, logits.shape[1], logits.stride(0), logits.stride(1)


def _temperatures(temperature, shape: torch.Size, device) -> torch.Tensor:
    """One fp32 temperature per row (a Python float or a tensor broadcasting as [..., 1])."""
    if isinstance(temperature, torch.Tensor):
        temp = temperature.to(device=device, dtype=torch.float32)
        return temp.expand(*shape, 1).reshape(-1).contiguous()
    return torch.full((shape.numel(),), float(temperature), dtype=torch.float32, device=device)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, tokens, temps):
        rows, inner, s_outer, s_inner = _as_rows(logits)
        count = tokens.numel()
        flat_tokens = tokens.reshape(-1).contiguous()
        out = torch.empty(count, dtype=torch.float32, device=logits.device)
        lse = torch.empty(count, dtype=torch.float32, device=logits.device)
        if count:
            vocab = logits.shape[-1]
            per_part = triton.cdiv(triton.cdiv(vocab, LOGPROB_PARTS), LOGPROB_BLOCK) * LOGPROB_BLOCK
            m_parts = torch.empty(count, LOGPROB_PARTS, dtype=torch.float32, device=logits.device)
            s_parts = torch.empty_like(m_parts)
            _logprob_part_kernel[(count, LOGPROB_PARTS)](
                rows,
                temps,
                m_parts,
                s_parts,
                inner,
                s_outer,
                s_inner,
                vocab,
                per_part,
                PARTS=LOGPROB_PARTS,
                BLOCK=LOGPROB_BLOCK,
                num_warps=LOGPROB_WARPS,
                enable_fp_fusion=False,  # one rounding per operation (docs/gpu.md)
            )
            _logprob_combine_kernel[(count,)](
                rows,
                flat_tokens,
                temps,
                m_parts,
                s_parts,
                out,
                lse,
                inner,
                s_outer,
                s_inner,
                PARTS=LOGPROB_PARTS,
                num_warps=1,
                enable_fp_fusion=False,  # one rounding per operation (docs/gpu.md)
            )
        ctx.save_for_backward(logits, flat_tokens, temps, lse)
        return out.reshape(tokens.shape)

    @staticmethod
    def backward(ctx, grad):
        logits, tokens, temps, lse = ctx.saved_tensors
        dlogits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        rows, inner, s_outer, s_inner = _as_rows(logits)
        drows, _, d_outer, d_inner = _as_rows(dlogits)
        if tokens.numel():
            _logprob_grad_kernel[(tokens.numel(),)](
                rows,
                tokens,
                temps,
                lse,
                grad.reshape(-1).float().contiguous(),
                drows,
                inner,
                s_outer,
                s_inner,
                d_outer,
                d_inner,
                logits.shape[-1],
                BLOCK=LOGPROB_BLOCK,
                num_warps=LOGPROB_WARPS,
            )
        return dlogits, None, None


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """fp32 log-softmax of `logits / temperature` gathered at `tokens`; [..., V] -> [...]."""
    temps = _temperatures(temperature, tokens.shape, logits.device)
    return _TokenLogprobs.apply(logits, tokens, temps)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, stride_x, stride_out, dim, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * stride_out + cols, e / tl.sum(e, axis=0), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """fp32 softmax over a short last dim (the MoE router's experts); no gradient needed."""
    dim = x.shape[-1]
    rows = x.reshape(-1, dim).contiguous()
    out = torch.empty(rows.shape, dtype=torch.float32, device=x.device)
    if rows.shape[0]:
        _softmax_kernel[(rows.shape[0],)](
            rows,
            out,
            rows.stride(0),
            out.stride(0),
            dim,
            BLOCK=triton.next_power_of_2(dim),
            num_warps=NORM_WARPS,
            enable_fp_fusion=False,  # one rounding per operation (docs/gpu.md)
        )
    return out.reshape(x.shape)

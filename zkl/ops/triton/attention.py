"""Zero mode's causal attention on CUDA: the invariant kernels forward, flash backward.

The kernels and their spec: `attention_kernels.py`; the tiles this device runs:
`attention_probe.py`; the default path: `attention_default.py` (its entry is re-exported
here with the kernels' names, so callers import one module).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zkl.ops.fast import attention_with_sinks
from zkl.ops.triton.attention_default import (
    DEFAULT_TILE,
    attention_default,
    window_mask,
)
from zkl.ops.triton.attention_kernels import (
    CHUNK,
    KEY_BLOCK,
    REF_M,
    REFERENCE,
    Tile,
    decode,
    decode_split,
    prefill,
)
from zkl.ops.triton.attention_probe import _CHOICES, PREFILL_TILES, Choice, choose, prefill_tile

__all__ = [
    "CHUNK",
    "DEFAULT_TILE",
    "KEY_BLOCK",
    "PREFILL_TILES",
    "REFERENCE",
    "REF_M",
    "_CHOICES",
    "Choice",
    "Tile",
    "attention",
    "attention_default",
    "choose",
    "decode",
    "decode_split",
    "prefill",
]


class _Attention(torch.autograd.Function):
    """The invariant forward; the backward recomputes with PyTorch's causal flash kernel
    (with sinks, which flash lacks: the eager form in fp32, the sinks getting their gradient)."""

    @staticmethod
    def forward(ctx, q, k, v, q_pos, window, sinks):
        ctx.save_for_backward(q, k, v, q_pos, sinks)
        ctx.window = window
        tile = prefill_tile(q.shape[-1], q.dtype, q.device)
        return prefill(q, k, v, q_pos, tile=tile, window=window, sinks=sinks)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, q_pos, sinks = ctx.saved_tensors
        groups = q.shape[1] // k.shape[1]
        with torch.enable_grad():
            qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
            if sinks is not None:
                sd = sinks.detach().requires_grad_()
                parts = (t.float() for t in (qd, kd, vd))
                out = attention_with_sinks(*parts, q_pos, sd.float(), ctx.window)
                dq, dk, dv, ds = torch.autograd.grad(out, (qd, kd, vd, sd), grad.float())
                return dq, dk, dv, None, None, ds
            # whole heads: flash's GQA support varies by version; the repeat's grad sums back
            kf = kd.repeat_interleave(groups, dim=1) if groups > 1 else kd
            vf = vd.repeat_interleave(groups, dim=1) if groups > 1 else vd
            if ctx.window:  # a band mask: SDPA's memory-efficient kernel, not flash
                mask = window_mask(q.shape[2], ctx.window, q.device)
                out = F.scaled_dot_product_attention(qd, kf, vf, attn_mask=mask)
            else:
                out = F.scaled_dot_product_attention(qd, kf, vf, is_causal=True)
            return (*torch.autograd.grad(out, (qd, kd, vd), grad), None, None, None)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, H, Tq, D]; k, v [R, Hkv, Tk, D] (key j at position j); q_pos [B, Tq]; sinks [H].

    Batch row b reads keys of row `kv_rows[b]` (default b); `window` W > 0 lets a query at p
    see only the keys p-W+1..p. With gradients (the train path, whose positions are 0..T-1
    and whose keys are its own queries) the backward is PyTorch's SDPA.
    """
    wants_grad = q.requires_grad or (sinks is not None and sinks.requires_grad)
    if kv_rows is None and torch.is_grad_enabled() and wants_grad:
        if q.shape[2] != k.shape[2]:
            raise ValueError("the train path's attention needs its own tokens as keys")
        # contiguous: the backward's flash kernel is slow on the projections' strided views
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return _Attention.apply(q, k, v, q_pos, window, sinks)
    choice = choose(q.shape[-1], q.dtype, q.device)
    extra = {"window": window, "sinks": sinks}
    if q.shape[2] == 1 and q.shape[1] // k.shape[1] <= REF_M:
        return decode(q, k, v, q_pos, kv_rows, rows_per_program=choice.decode_rows, **extra)
    return prefill(q, k, v, q_pos, kv_rows, tile=choice.prefill, **extra)

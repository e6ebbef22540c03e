"""The CUDA forms of the kernels (Triton), fast and invariant, behind the CPU forms' names.

`zkl.ops`' table names each op's CUDA cells here; it imports this module only when a tensor
is on a CUDA device, so the CPU path never needs Triton. Most names are the kernel modules'
own; the few below adapt a kernel to the op's signature (a gradient's fallback, the SSD
commit's exponentials).
"""

from __future__ import annotations

import torch

from zkl.ops import fa4, fast, fastest_attention
from zkl.ops.ssd import decays
from zkl.ops.triton import attention as triton_attention
from zkl.ops.triton import fused
from zkl.ops.triton import ssd as ssd_kernel
from zkl.ops.triton.commit import commit_samples
from zkl.ops.triton.fused import rotary_into_cache, silu_mul
from zkl.ops.triton.gemm import linear
from zkl.ops.triton.grouped_gemm import grouped_linear, grouped_linear_default
from zkl.ops.triton.rowwise import rms_norm, rms_norm_default, softmax, token_logprobs
from zkl.ops.triton.sampling import gumbel_argmax

__all__ = [
    "add_rms_norm",
    "add_rms_norm_default",
    "attention",
    "attention_default",
    "commit_samples",
    "grouped_linear",
    "grouped_linear_default",
    "gumbel_argmax",
    "linear",
    "rms_norm",
    "rms_norm_default",
    "rotary",
    "rotary_into_cache",
    "silu_mul",
    "softmax",
    "ssd_commit_rows_",
    "token_logprobs",
]


def _wants_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The invariant form: one fused pass (the add's bits, then the norm kernel's) where no
    gradient is wanted; with one, the add, then the norm kernel (which has a backward)."""
    if _wants_grad(x, delta):
        total = x + delta
        return total, rms_norm(total, weight, eps)
    return fused.add_rms_norm(x, delta, weight, eps)


def add_rms_norm_default(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The default path's: the same fused pass contracted as a fast generator compiles it (a
    row-wise norm needs no fix; fast generators fuse the residual add into it); with a
    gradient, the add, then `rms_norm_default`."""
    if _wants_grad(x, delta):
        total = x + delta
        return total, rms_norm_default(total, weight, eps)
    return fused.add_rms_norm(x, delta, weight, eps, fp_fusion=True)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Zero mode's attention: flash-attn-4 with one split where this device keeps its bits
    a function of the query alone (`fa4.serves`, probed once per head dim and dtype), else
    zkl's Triton kernels (fp32, no flash-attn-4, a GPU before Hopper)."""
    if fa4.serves(q.shape[-1], q.dtype, q.device):
        return fa4.attention(q, k, v, q_pos, kv_rows, window=window, sinks=sinks)
    return triton_attention.attention(q, k, v, q_pos, kv_rows, window=window, sinks=sinks)


def attention_default(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """What a fast generator runs: the fastest attention this device has for the call's shape
    (SDPA, flash-attn-4 with its own splits, zkl's default Triton kernels), measured once
    per shape (`zkl.ops.fastest_attention`)."""
    return fastest_attention.attention(q, k, v, q_pos, kv_rows, window=window, sinks=sinks)


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused pass with the torch form's bits where no gradient is wanted; with one, the
    torch form (the fused pass has no backward)."""
    if _wants_grad(q, k):
        return fast.rotary(q, k, cos, sin, positions)
    return fused.rotary(q, k, cos, sin, positions)


def ssd_commit_rows_(
    state: torch.Tensor,
    slots: torch.Tensor,
    full: torch.Tensor,
    B: torch.Tensor,
    cum: torch.Tensor,
    xdt: torch.Tensor,
) -> None:
    """`zkl.ops.ssd.commit_rows_` on the device: the row flags read by the kernel, not the
    host, so a CUDA graph can hold the step; the exponentials are torch's, as the train
    path's."""
    to_end, decay = decays(cum)
    ssd_kernel.commit_rows_(state, slots, full, B[:, 0], to_end[:, 0], xdt[:, 0], decay)

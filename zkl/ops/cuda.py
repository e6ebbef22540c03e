"""The batch-invariant CUDA forms of the kernels (Triton), behind the same names as the CPU's.

Imported only when a tensor is on a CUDA device, so the CPU path never needs Triton.
"""

from __future__ import annotations

from zkl.ops.triton.attention import attention, attention_default
from zkl.ops.triton.commit import commit_samples
from zkl.ops.triton.fused import add_rms_norm, rotary, rotary_into_cache, silu_mul
from zkl.ops.triton.gemm import linear
from zkl.ops.triton.grouped_gemm import grouped_linear, grouped_linear_default
from zkl.ops.triton.rowwise import rms_norm, softmax, token_logprobs
from zkl.ops.triton.sampling import gumbel_argmax

__all__ = [
    "add_rms_norm",
    "attention",
    "attention_default",
    "commit_samples",
    "grouped_linear",
    "grouped_linear_default",
    "gumbel_argmax",
    "linear",
    "rms_norm",
    "rotary",
    "rotary_into_cache",
    "silu_mul",
    "softmax",
    "token_logprobs",
]

"""Per-tensor current-scaling FP8 (E4M3): the batch-variant contrast to rowwise MXFP8.

One scale for the whole tensor, from the amax over the WHOLE tensor. Under batching that amax
is taken over every sequence in the batch, so one row's quantized values change when a row
with a larger magnitude joins the batch: the result is batch-variant by design. Rowwise MXFP8
(`zkl.precision.mx`) takes its amax per 32 elements of one row and has no such coupling.
A fused weight (q/k/v, gate/up) gets one scale per part (`zkl.precision.recipes.quantize_parts`), as
the separate projections of an HF model would.
"""

from __future__ import annotations

import torch

from zkl.precision.mx import E4M3_MAX, e4m3_satfinite

_FP32_MAX = torch.finfo(torch.float32).max


def fp8_tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """The fp32 scale 448 / amax(whole tensor), TE's compute_scale_from_amax: 1 when amax is
    0, inf or NaN, fp32 max when 448 / amax overflows."""
    xf = x.float()
    amax = xf.abs().amax() if xf.numel() else xf.new_zeros(())
    scale = torch.tensor(E4M3_MAX, dtype=torch.float32) / amax
    scale = torch.where(torch.isinf(scale), _FP32_MAX, scale)
    return torch.where((amax == 0) | ~torch.isfinite(amax), 1.0, scale)


def fake_quantize_fp8_tensor(x: torch.Tensor) -> torch.Tensor:
    """Quantize to E4M3 with `fp8_tensor_scale(x)`, dequantize as q / scale, in x's dtype."""
    xf = x.float()
    scale = fp8_tensor_scale(xf)
    q = e4m3_satfinite(xf * scale)
    return (q.float() / scale).to(x.dtype)

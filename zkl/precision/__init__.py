"""Precision recipes: parameter dtypes and what a Linear layer does to its weight and input.

`bf16` and `fp32` run the Linear as it is. `mxfp8` (OCP MX, TE's scale rule) and
`fp8_tensor` (per-tensor current scaling, the batch-variant contrast) fake-quantize weight
and input before the GEMM. The recipe is installed on the model's Linear layers
(`apply_precision`); a generation engine may install a cache of quantized weights
(`weight_cache`) so it quantizes each weight once per refit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

_weight_cache: dict[int, torch.Tensor] | None = None


def fake_quantizer(kind: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The straight-through fake-quant function of a recipe (None: no quantization)."""
    if kind == "none":
        return None
    if kind == "mxfp8":
        from zkl.precision.mx import mxfp8_fake_quant_ste

        return mxfp8_fake_quant_ste
    if kind == "fp8_tensor":
        from zkl.precision.fp8_tensor import fp8_tensor_fake_quant_ste

        return fp8_tensor_fake_quant_ste
    raise ValueError(f"precision.linear_quant={kind!r} is not one of none, mxfp8, fp8_tensor.")


def apply_precision(model: nn.Module, compute_dtype: torch.dtype, linear_quant: str) -> None:
    """Cast parameters (norms and MoE router stay fp32) and install the Linear recipe."""
    quantize = fake_quantizer(linear_quant)
    for name, module in model.named_modules():
        keep_fp32 = name.endswith("norm") or name.endswith("layernorm") or name.endswith(".gate")
        for p in module.parameters(recurse=False):
            p.data = p.data.to(torch.float32 if keep_fp32 else compute_dtype)
        if hasattr(module, "quantizable"):
            module.quantize = quantize if module.quantizable else None


@contextlib.contextmanager
def weight_cache(cache: dict[int, torch.Tensor]) -> Iterator[None]:
    """Use (and fill) `cache` of quantized weights, keyed by module id, inside the block."""
    global _weight_cache
    previous, _weight_cache = _weight_cache, cache
    try:
        yield
    finally:
        _weight_cache = previous


def linear_weight_and_input(
    module: nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (weight, input) pair the GEMM sees under the module's recipe."""
    quantize = getattr(module, "quantize", None)
    if quantize is None:
        return module.weight, x
    if _weight_cache is None:
        weight = quantize(module.weight)
    else:
        weight = _weight_cache.get(id(module))
        if weight is None:
            weight = _weight_cache[id(module)] = quantize(module.weight.detach())
    return weight, quantize(x)

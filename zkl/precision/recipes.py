"""Precision recipes: parameter dtypes and what a Linear layer does to its weight and input.

`bf16` and `fp32` run the Linear as it is. `mxfp8` (OCP MX with Transformer Engine's scale
rule, `zkl.precision.mx`) and `fp8_tensor` (per-tensor current scaling, the batch-variant
contrast, `zkl.precision.fp8_tensor`) fake-quantize the weight and the input of every
quantizable Linear before the GEMM: quantize -> dequantize -> `zkl.ops.linear` (the
batch-invariant GEMM with fp32 accumulation when `batch_invariant_gemm` is on).

What is quantized: the Linear layers of attention (qkv_proj, o_proj) and of the MLPs and MoE
experts (gate_up_proj, down_proj); a fused weight is quantized part by part (one per-tensor
scale for each of q, k, v, gate, up, as separate projections would have). What is not: the
embedding (an `nn.Embedding`, no recipe), the lm_head and the MoE router `mlp.gate`
(`Linear(..., quantizable=False)`), and the norms. The router and the norms also keep fp32
parameters (`apply_precision`).

Both paths run the same recipe on the same tensors. The trainer quantizes the weight afresh
on every forward (it is about to change it). The scheduler quantizes each weight once
per refit: inside `weight_cache(cache)` the quantized weight of a module is looked up in, or
added to, the scheduler's cache; the scheduler clears the cache when new weights arrive (the
`quantized_weight_refresh` fix). Quantizing the same bf16 weight gives the same bits either
way, so the GEMM operands of the two paths are bitwise equal.

Batch invariance: MXFP8 blocks are 32 consecutive elements of one row along K, so a token's
quantized input depends on that token alone, whatever else is in the batch; the weight's
quantization does not depend on the batch at all. `fp8_tensor` takes one amax over the whole
input tensor (every token of the batch), so a token's quantized input changes with its batch
neighbours: it cannot be batch-invariant, and the gen path (continuous-batching decode) and the
train path (one padded scoring batch) quantize the same token differently.

Backward: straight-through on the dequantized operands. With y = x_q W_q^T (x_q, W_q the
fake-quantized input and weight), autograd gives dx = dy W_q and dW = dy^T x_q, and the
quantizers pass these through as the gradients of x and W; dy is not quantized. Transformer
Engine's MXFP8 backward instead multiplies MXFP8 copies quantized *columnwise* (blocks along M
or N: the K of the backward GEMMs) and an MXFP8 dy, so its gradients differ from these by
quantization noise. That changes the update, not the forward logprobs the mismatch metrics
compare, and it keeps the CPU reference simple: the train forward is literally the gen forward.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn

from zkl.precision.fp8_tensor import fake_quantize_fp8_tensor
from zkl.precision.mx import fake_quantize_mxfp8
from zkl.switch import Switch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The active generation-side cache of quantized weights (None: quantize on every call).
_WEIGHT_CACHE: Switch[dict[int, torch.Tensor] | None] = Switch("weight_cache", None)


class _StraightThrough(torch.autograd.Function):
    """`quantize(x)` forward; the gradient passes through unchanged (quantization's derivative
    is 0 almost everywhere, so training needs the identity in its place)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, quantize: Callable[[torch.Tensor], torch.Tensor]):
        return quantize(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def straight_through(
    quantize: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """`quantize(x)` with a straight-through (identity) gradient."""
    return _StraightThrough.apply(x, quantize)


FAKE_QUANTIZERS = {"mxfp8": fake_quantize_mxfp8, "fp8_tensor": fake_quantize_fp8_tensor}


def fake_quantizer(kind: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The fake-quant function of a `precision.linear_quant` value (None: no quantization).

    Each returns a tensor of its input's dtype and shape holding the dequantized values, with
    a straight-through (identity) gradient.
    """
    if kind == "none":
        return None
    if kind not in FAKE_QUANTIZERS:
        raise ValueError(f"precision.linear_quant={kind!r} is not one of none, mxfp8, fp8_tensor.")
    return functools.partial(straight_through, FAKE_QUANTIZERS[kind])


def keeps_fp32(module_name: str) -> bool:
    """Norms and the MoE router (`mlp.gate`) keep fp32 parameters in every recipe."""
    return (
        module_name.endswith("norm")
        or module_name.endswith("layernorm")
        or module_name.endswith(".gate")
    )


class RecipeLinear(nn.Module):
    """A Linear the precision recipe applies to (`zkl.models.transformer.Linear`).

    `quantizable` is False for the embedding, lm_head and router; `quantize` is the fake
    quantizer `apply_precision` installs (None: the GEMM sees the weight and input as they
    are); `parts` the rows of each part of a fused projection (empty: one part).
    """

    quantizable: bool = True
    quantize: Callable[[torch.Tensor], torch.Tensor] | None = None
    parts: dict[str, int]


def apply_precision(model: nn.Module, compute_dtype: torch.dtype, linear_quant: str) -> None:
    """Cast parameters to `compute_dtype` (norms and router stay fp32); install the recipe:
    every quantizable `RecipeLinear` gets the recipe's fake quantizer, the others None."""
    quantize = fake_quantizer(linear_quant)
    for name, module in model.named_modules():
        dtype = torch.float32 if keeps_fp32(name) else compute_dtype
        for p in module.parameters(recurse=False):
            p.data = p.data.to(dtype)
        if isinstance(module, RecipeLinear):
            module.quantize = quantize if module.quantizable else None


def quantizes(model: nn.Module) -> bool:
    """Whether the recipe `apply_precision` installed quantizes any of the model's Linears."""
    return any(isinstance(m, RecipeLinear) and m.quantize is not None for m in model.modules())


@contextlib.contextmanager
def weight_cache(cache: dict[int, torch.Tensor]) -> Iterator[None]:
    """Inside the block, quantized weights come from (and go into) `cache`, keyed by module id.

    For inference only (the cached weights are detached). The key is `id(module)` of the
    Linear: ids are unique among live objects, and the owner of the cache (the generator)
    also owns the model, so every keyed module lives as long as its entry. A refit
    copies new values into the same Parameters in place (or, colocated, shares the trainer's
    model), so the modules and their keys stay while the cached *values* go stale; the owner
    must clear the cache after every refit (fix `quantized_weight_refresh`). The cache does
    not notice changed weights by itself (by `weight._version`, say) on purpose: invalidation
    is the refit's explicit job, and the fix's test shows what happens when it is skipped.
    The active cache is a `zkl.switch.Switch`, the one mechanism the fixes' switch uses too.
    """
    with _WEIGHT_CACHE.scoped(cache):
        yield


def quantize_parts(
    quantize: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor, parts: list[int]
) -> torch.Tensor:
    """A fused weight quantized one part (rows `parts`, in order) at a time.

    A per-tensor recipe then keeps one scale per part (q, k, v; gate, up), the scales that
    separate projections would have. MXFP8 scales 32 elements of one row, so for it the
    split changes no bit.
    """
    if len(parts) <= 1:
        return quantize(weight)
    return torch.cat([quantize(w) for w in weight.split(parts)])


def linear_weight_and_input(
    module: RecipeLinear, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (weight, input) pair the GEMM sees under the module's recipe.

    No recipe: the module's weight and x unchanged. Otherwise the fake-quantized weight (from
    the active `weight_cache` if any, else quantized now; a fused weight part by part, see
    `quantize_parts`) and the fake-quantized x.
    """
    quantize = module.quantize
    if quantize is None:
        return module.weight, x
    parts = list(module.parts.values())
    cache = _WEIGHT_CACHE.get()
    if cache is None:
        weight = quantize_parts(quantize, module.weight, parts)
    else:
        assert not torch.is_grad_enabled(), "a weight cache is for inference (no_grad) only"
        weight = cache.get(id(module))
        if weight is None:
            weight = quantize_parts(quantize, module.weight.detach(), parts)
            cache[id(module)] = weight
        assert weight.shape == module.weight.shape and weight.dtype == module.weight.dtype, (
            "a cached quantized weight does not fit its module: the cache outlived its model"
        )
    return weight, quantize(x)

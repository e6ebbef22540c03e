"""Stacked projections: q/k/v (and gate/up) as one GEMM where the weights lie back to back.

A decode step at a small batch is bound by launches and by how well each GEMM fills the
device, so a fast engine multiplies by the stacked [q; k; v] matrix once instead of three
times. zkl gets the stack without a second copy of the weights: `stack_projections` moves
each group's parameters into one storage (the parameters become views of it, so optimizer
steps, refits and checkpoint loads, which all write in place, keep it current), and
`stacked_linear` multiplies by a view of that storage.

Exactness: a stacked GEMM must give each part the bits of its own GEMM. The invariant GEMM
does where the device is checked to (`ops.linear_columns_agree`); the default path has no
such promise to keep (cuBLAS), and the CPU reference never stacks. The stack serves
inference only: with gradients on, each Linear runs alone so its parameter gets its grad.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zkl import ops

_CACHE_ATTR = "_zkl_stacked"  # on the group's first Linear: (pointers, weight, bias)


def _back_to_back(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether the tensors are contiguous and follow each other in one storage, in order."""
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()  # adjacent addresses alone are not enough:
    if not all(  # a caching allocator often places separate tensors end to end
        t.is_contiguous() and t.dtype == first.dtype and t.untyped_storage().data_ptr() == storage
        for t in tensors
    ):
        return False
    end = first.data_ptr() + first.numel() * first.element_size()
    for t in tensors[1:]:
        if t.data_ptr() != end:
            return False
        end += t.numel() * t.element_size()
    return True


def _biases(linears: Sequence[nn.Module]) -> list[torch.Tensor] | None:
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    if any(b is None for b in biases):
        raise ValueError("a stacked projection needs a bias on every part or on none")
    return biases


def _stacked(linears: Sequence[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The group's weights (and biases) as one [sum N, K] view, or None if not back to back."""
    weights = [lin.weight for lin in linears]
    biases = _biases(linears)
    key = tuple(t.data_ptr() for t in weights + (biases or []))
    cached = getattr(linears[0], _CACHE_ATTR, None)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    if not _back_to_back(weights) or (biases is not None and not _back_to_back(biases)):
        return None
    rows, depth = sum(w.shape[0] for w in weights), weights[0].shape[1]
    weight = weights[0].detach().as_strided((rows, depth), (depth, 1))
    bias = None if biases is None else biases[0].detach().as_strided((rows,), (1,))
    object.__setattr__(linears[0], _CACHE_ATTR, (key, weight, bias))  # not a buffer
    return weight, bias


def stacked_linear(
    x: torch.Tensor, linears: Sequence[nn.Module]
) -> tuple[torch.Tensor, ...] | None:
    """Each Linear's output on x from one GEMM over the stacked weights, or None where that
    is not possible (gradients on, a quantizing recipe, weights not stacked) or not exact."""
    if torch.is_grad_enabled() or any(getattr(lin, "quantize", None) for lin in linears):
        return None
    stacked = _stacked(linears)
    if stacked is None:
        return None
    weight, bias = stacked
    widths = [lin.weight.shape[0] for lin in linears]
    if not ops.linear_columns_agree(x, weight.shape[1], widths, weight.dtype):
        return None
    return ops.linear(x, weight, bias).split(widths, dim=-1)


def projection_groups(model: nn.Module) -> list[tuple[nn.Module, ...]]:
    """The Linears that run on the same input: each attention's q/k/v, each MLP's gate/up."""
    groups = []
    for module in model.modules():
        names = ("q_proj", "k_proj", "v_proj") if hasattr(module, "v_proj") else ()
        if hasattr(module, "gate_proj") and hasattr(module, "up_proj"):
            names = ("gate_proj", "up_proj")
        if names:
            groups.append(tuple(getattr(module, name) for name in names))
    return groups


@torch.no_grad()
def stack_projections(model: nn.Module) -> int:
    """Move each projection group's parameters into one storage, back to back; how many
    groups moved (0 when all were stacked already). Values and parameter objects stay."""
    moved = 0
    for linears in projection_groups(model):
        for attr in ("weight", "bias"):
            params = [getattr(lin, attr) for lin in linears]
            if all(p is None for p in params):
                continue
            if any(p is None for p in params):
                raise ValueError("a stacked projection needs a bias on every part or on none")
            if _back_to_back(params):
                continue
            storage = torch.cat([p.detach().reshape(-1) for p in params])
            offset = 0
            for p in params:
                p.data = storage[offset : offset + p.numel()].view(p.shape)
                offset += p.numel()
            moved += 1
    return moved

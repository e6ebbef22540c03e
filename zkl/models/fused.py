"""Fused projections under the names of separate ones.

The models store the projections that read one input back to back as one weight
(`transformer.Linear` with parts: q/k/v as `qkv_proj`, gate/up as `gate_up_proj`), so every
path runs one GEMM per group. HF checkpoints name each part on its own (`q_proj`, `k_proj`,
`v_proj`; `gate_proj`, `up_proj`), and the seeded init draws each part as the separate
projection it stands for, so a fused model starts from the weights separate ones would have.
These helpers translate between the two namings, reading the parts from the model itself.
"""

from __future__ import annotations

import torch
from torch import nn

Layout = dict[str, list[tuple[str, int]]]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def fused_layout(model: nn.Module) -> Layout:
    """Each fused tensor's state-dict name -> its parts' names and rows, in order."""
    layout: Layout = {}
    for prefix, module in model.named_modules():
        parts = getattr(module, "parts", None)
        if not parts:
            continue
        parent = prefix.rpartition(".")[0]
        for attr in ("weight", "bias"):
            if getattr(module, attr, None) is not None:
                layout[f"{prefix}.{attr}"] = [
                    (_join(parent, f"{part}.{attr}"), rows) for part, rows in parts.items()
                ]
    return layout


def split_fused(state: dict[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """`state` with each fused tensor replaced by its parts (views), under the parts' names."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key in layout:
            names, rows = zip(*layout[key])
            out.update(zip(names, tensor.split(list(rows))))
        else:
            out[key] = tensor
    return out


def join_fused(state: dict[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """The inverse of `split_fused`: each fused tensor concatenated from its parts (a copy)."""
    part_names = {name for entries in layout.values() for name, _ in entries}
    out = {k: v for k, v in state.items() if k not in part_names}
    for key, entries in layout.items():
        out[key] = torch.cat([state[name] for name, _ in entries])
    return out


def init_order(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The parameters in the order, and under the names, that separate projections would
    register them: a fused weight and bias become part 1's weight, part 1's bias, part 2's
    weight, ... (views into the fused parameters). The seeded init numbers them in this
    order, so fusing changes no drawn value."""
    layout = fused_layout(model)
    params = dict(model.named_parameters())
    order: list[tuple[str, torch.Tensor]] = []
    for name, p in params.items():
        if name not in layout:
            order.append((name, p))
            continue
        prefix, _, attr = name.rpartition(".")
        if attr == "bias":
            continue  # drawn beside its weight's parts
        bias_key = f"{prefix}.bias"
        tensors = [(name, p)] + ([(bias_key, params[bias_key])] if bias_key in layout else [])
        pieces = [list(split_fused({key: t}, layout).items()) for key, t in tensors]
        for part in zip(*pieces):
            order.extend(part)
    return order

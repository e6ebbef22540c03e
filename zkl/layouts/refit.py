"""What a refit moves from the trainer to the generator, and how the generator takes it in."""

from __future__ import annotations

import torch

from zkl.invariance import is_enabled


def refits_exactly() -> bool:
    """Whether a refit hands the generator the trainer's own tensors (`refit_exactness`):
    then a colocated generator can share the trainer's model outright."""
    return is_enabled("refit_exactness")


def refit_payload(
    state: dict[str, torch.Tensor], gen_dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """What a refit sends: the trainer's exact tensors, or (fix off) all cast to `gen_dtype`."""
    if refits_exactly():
        return state
    return {k: v.to(gen_dtype) if v.is_floating_point() else v for k, v in state.items()}


def load_refit(model: torch.nn.Module, payload: dict[str, torch.Tensor]) -> None:
    """Copy a complete payload into the model's parameters in place, or change nothing."""
    params = dict(model.named_parameters())
    if set(params) != set(payload):
        missing = sorted(set(params) ^ set(payload))
        raise RuntimeError(f"refit payload does not match the model's parameters: {missing[:4]}")
    shape = getattr(payload, "shape", lambda name: payload[name].shape)  # lazy: no gather
    for name, p in params.items():
        if p.shape != shape(name):
            raise RuntimeError(f"refit tensor {name} has shape {tuple(shape(name))}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(payload[name])

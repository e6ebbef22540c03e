"""Which device a run uses: `device=cpu` (the embedded default), `cuda`, `cuda:N` or `auto`."""

from __future__ import annotations

import torch

CHOICES = ("cpu", "cuda", "auto")


def check_device(name: str) -> str | None:
    """None if `device=name` can run here, else the sentence saying why not."""
    base, _, index = name.partition(":")
    if base not in CHOICES or (index and (base != "cuda" or not index.isdigit())):
        return f"device={name!r} must be cpu, cuda, cuda:N or auto."
    if base == "cuda":
        if not torch.cuda.is_available():
            return f"device={name!r} needs a CUDA GPU and this machine has none; use device=cpu."
        if index and int(index) >= torch.cuda.device_count():
            return f"device={name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)."
    return None


def resolve_device(name: str) -> torch.device:
    """`auto` -> the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device

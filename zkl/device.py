"""Which device a run uses: `device=cpu` (the embedded default), `cuda`, `cuda:N` or `auto`."""

from __future__ import annotations

from typing import Any

import torch

from zkl.errors import ConfigError
from zkl.placement import OWN_GPU_TRANSPORT, own_gpu

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


def on_cuda(cfg: Any) -> bool:
    """Whether the run computes on a CUDA device: `device=cuda`, `cuda:N`, or `auto` on a
    machine with one. Reads the name only, so a config can be estimated on any machine."""
    name = str(cfg.device)
    if name == "auto":
        return torch.cuda.is_available()
    return name.partition(":")[0] == "cuda"


def generator_device(cfg) -> torch.device:
    """The dedicated generator's device: the trainer's, or with `layout.transport=nccl` a GPU
    of its own (`layout.generator_device`, default the GPU after the trainer's; the rule is
    `zkl.placement.own_gpu`).

    Raises the one sentence a config that cannot place its generator gets.
    """
    trainer = resolve_device(str(cfg.device))
    wanted = cfg.layout.generator_device
    if cfg.layout.transport != OWN_GPU_TRANSPORT:
        if wanted is not None and torch.device(_parse(wanted)) != trainer:
            raise ConfigError(
                f"layout.generator_device={wanted!r} needs layout.transport=nccl (gloo and "
                "cuda_ipc keep the generator on the trainer's device); set it to null."
            )
        return trainer
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if trainer.type != "cuda" or count < 2:
        raise ConfigError(
            "layout.transport=nccl puts the generator on a GPU of its own and needs device=cuda "
            f"with two CUDA devices (this machine has {count}); use layout.transport=auto."
        )
    if not own_gpu(cfg.layout.name, cfg.layout.transport):
        raise ConfigError(
            "layout.transport=nccl is for +layout=dedicated; use layout.transport=auto."
        )
    device = torch.device(
        _parse(wanted) if wanted is not None else f"cuda:{(trainer.index + 1) % count}"
    )
    if device.type != "cuda" or device.index is None or device.index >= count:
        raise ConfigError(
            f"layout.generator_device={wanted!r} must be cuda:N with N below {count}."
        )
    if device == trainer:
        raise ConfigError(
            f"layout.generator_device={wanted!r} is the trainer's device; layout.transport=nccl "
            "needs another GPU (or use layout.transport=cuda_ipc to share one)."
        )
    return device


def _parse(name: str) -> str:
    base, _, index = str(name).partition(":")
    if base not in ("cpu", "cuda") or (index and (base != "cuda" or not index.isdigit())):
        raise ConfigError(f"layout.generator_device={name!r} must be cpu, cuda:N or null.")
    return str(name)

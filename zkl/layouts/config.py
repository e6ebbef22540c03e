"""The layout part's config (conf/layout) and the check of its own keys, a leaf of the schema."""

from __future__ import annotations

from dataclasses import dataclass

from zkl.errors import ConfigError

MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 86400.0
TRANSPORTS = ("auto", "gloo", "cuda_ipc", "nccl")


@dataclass
class LayoutConfig:
    name: str = "colocated"  # colocated | dedicated
    # How the dedicated refit moves weights: gloo (torch.distributed, CPU), cuda_ipc (one
    # GPU shared by both processes: device memory handed over, no host round trip), nccl
    # (the generator on a GPU of its own, broadcast over NCCL); auto: gloo on the CPU,
    # cuda_ipc on CUDA.
    transport: str = "auto"
    # The generator's GPU with transport=nccl (null: the GPU after the trainer's `device`);
    # the other transports keep the generator on the trainer's device.
    generator_device: str | None = None
    timeout_s: float = 600.0


def check(layout: LayoutConfig) -> None:
    """One sentence naming the layout.* key whose value cannot work."""
    if layout.name not in ("colocated", "dedicated"):
        raise ConfigError(f"layout.name={layout.name!r} must be colocated or dedicated.")
    if layout.transport not in TRANSPORTS:
        raise ConfigError(
            f"layout.transport={layout.transport!r} must be auto, gloo, cuda_ipc or nccl."
        )
    if not MIN_TIMEOUT_S <= layout.timeout_s <= MAX_TIMEOUT_S:
        raise ConfigError(
            f"layout.timeout_s={layout.timeout_s} must be between {MIN_TIMEOUT_S:g} and "
            f"{MAX_TIMEOUT_S:g} (a day)."
        )

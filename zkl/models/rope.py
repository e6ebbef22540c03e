"""RoPE's inverse frequencies by `model.rope_type`: one rule each, chosen from a table.

Computed in float64 on the CPU, so every device gets the same tables; the rules follow
transformers' `ROPE_INIT_FUNCTIONS` of the same names.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from zkl.models.config import ModelConfig


def _default(cfg: ModelConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    return inv_freq


def _linear(cfg: ModelConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """Positions divided by `rope_factor` (the same as frequencies divided by it)."""
    return inv_freq / cfg.rope_factor


def _llama3(cfg: ModelConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `rope_factor`, short ones kept, the band between
    the two wavelength limits of the original context interpolated."""
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    context = cfg.rope_original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, smoothed, scaled)


ROPE_TYPES: dict[str, Callable[[ModelConfig, torch.Tensor], torch.Tensor]] = {
    "default": _default,
    "linear": _linear,
    "llama3": _llama3,
}


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """[head_dim / 2] float64 on the CPU: the angle a position turns each rotary pair by."""
    steps = torch.arange(0, cfg.head_dim, 2, dtype=torch.float64, device="cpu")
    inv_freq = 1.0 / (cfg.rope_theta ** (steps / cfg.head_dim))
    return ROPE_TYPES[cfg.rope_type](cfg, inv_freq)


def validate_rope(cfg: ModelConfig) -> None:
    """One sentence naming the key, before any table is built."""
    if cfg.rope_type not in ROPE_TYPES:
        raise ValueError(f"model.rope_type={cfg.rope_type!r} is not one of {list(ROPE_TYPES)}.")
    if cfg.rope_type != "default" and cfg.rope_factor <= 0:
        raise ValueError(f"model.rope_factor={cfg.rope_factor} must be positive.")
    if cfg.rope_type == "llama3":
        if cfg.rope_original_max_position_embeddings <= 0:
            raise ValueError(
                "model.rope_original_max_position_embeddings must be positive for "
                "model.rope_type=llama3."
            )
        if not 0 < cfg.rope_low_freq_factor < cfg.rope_high_freq_factor:
            raise ValueError(
                f"model.rope_low_freq_factor={cfg.rope_low_freq_factor} must be positive and "
                f"below model.rope_high_freq_factor={cfg.rope_high_freq_factor}."
            )

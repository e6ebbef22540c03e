"""RoPE by `model.rope.type`: each type's inverse frequencies and cos/sin scale, one rule each,
chosen from a table.

Computed in float64 on the CPU, so every device gets the same tables; the rules follow
transformers' `ROPE_INIT_FUNCTIONS` of the same names. YaRN (gpt-oss) keeps the frequencies
whose wavelength fits many times in the original context (extrapolation), divides those that
fit less than once by `factor` (interpolation), blends the two by a linear ramp over the
dimensions between `beta_fast` and `beta_slow` rotations, and scales cos and sin by
`0.1 ln(factor) + 1`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from zkl.models.config import ModelConfig

Rule = Callable[[ModelConfig, torch.Tensor], tuple[torch.Tensor, float]]


def _default(cfg: ModelConfig, inv_freq: torch.Tensor) -> tuple[torch.Tensor, float]:
    return inv_freq, 1.0


def _linear(cfg: ModelConfig, inv_freq: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Positions divided by `factor` (the same as frequencies divided by it)."""
    return inv_freq / cfg.rope.factor, 1.0


def _llama3(cfg: ModelConfig, inv_freq: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Llama 3.1: long wavelengths slowed by `factor`, short ones kept, the band between the two
    wavelength limits of the original context interpolated."""
    rope = cfg.rope
    factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    context = rope.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, smoothed, scaled), 1.0


def _correction_dim(rotations: float, dim: int, base: float, context: int) -> float:
    """The dimension whose frequency turns `rotations` times over `context` positions."""
    return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))


def _yarn(cfg: ModelConfig, inv_freq: torch.Tensor) -> tuple[torch.Tensor, float]:
    """YaRN's NTK-by-parts frequencies and its cos/sin scale (the module docstring)."""
    rope, dim = cfg.rope, cfg.head_dim
    context = rope.original_max_position_embeddings
    low = _correction_dim(rope.beta_fast, dim, rope.theta, context)
    high = _correction_dim(rope.beta_slow, dim, rope.theta, context)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width
    interpolated = inv_freq / rope.factor
    pair = torch.arange(dim // 2, dtype=torch.float64, device="cpu")
    ramp = ((pair - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: keep the original frequency
    scaled = interpolated * (1 - keep) + inv_freq * keep
    scale = 0.1 * math.log(rope.factor) + 1.0 if rope.factor > 1 else 1.0
    return scaled, scale


ROPE_TYPES: dict[str, Rule] = {
    "default": _default,
    "linear": _linear,
    "llama3": _llama3,
    "yarn": _yarn,
}


def frequencies(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] float64 on the CPU: the angle a position turns each
    rotary pair by, the cos/sin scale) of `model.rope`."""
    steps = torch.arange(0, cfg.head_dim, 2, dtype=torch.float64, device="cpu")
    inv_freq = 1.0 / (cfg.rope.theta ** (steps / cfg.head_dim))
    return ROPE_TYPES[cfg.rope.type](cfg, inv_freq)


def validate_rope(cfg: ModelConfig) -> None:
    """One sentence naming the key, before any table is built (the signs: `check_signs`)."""
    rope = cfg.rope
    if rope.type not in ROPE_TYPES:
        raise ValueError(f"model.rope.type={rope.type!r} is not one of {list(ROPE_TYPES)}.")
    if rope.type in ("llama3", "yarn") and rope.original_max_position_embeddings <= 0:
        raise ValueError(
            "model.rope.original_max_position_embeddings must be positive for "
            f"model.rope.type={rope.type}."
        )
    if rope.type == "llama3" and not rope.low_freq_factor < rope.high_freq_factor:
        raise ValueError(
            f"model.rope.low_freq_factor={rope.low_freq_factor} must be below "
            f"model.rope.high_freq_factor={rope.high_freq_factor}."
        )
    if rope.type == "yarn" and rope.factor < 1:
        raise ValueError(f"model.rope.factor={rope.factor} must be at least 1 for yarn.")

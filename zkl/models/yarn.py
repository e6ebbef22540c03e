"""YaRN rotary embedding (gpt-oss): NTK-by-parts frequencies and a cos/sin scale.

Frequencies whose wavelength fits many times in the original context keep their value
(extrapolation), those that fit less than once are divided by `factor` (interpolation), and a
linear ramp over the dimensions between `beta_fast` and `beta_slow` rotations blends the two;
cos and sin are multiplied by `0.1 ln(factor) + 1`. The tables are built in float64 on the
CPU and rounded to fp32 once, so every device gets the same tables (as `RotaryEmbedding`).
"""

from __future__ import annotations

import math

import torch

from zkl.models.config import ModelConfig
from zkl.models.transformer import RotaryEmbedding


def _correction_dim(rotations: float, dim: int, base: float, context: int) -> float:
    """The dimension whose frequency turns `rotations` times over `context` positions."""
    return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_frequencies(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [D/2] float64 on the CPU, the cos/sin scale) of `cfg`'s YaRN
    parameters."""
    dim, base, factor = cfg.head_dim, cfg.rope_theta, cfg.yarn_factor
    context = cfg.yarn_original_max_position_embeddings
    low = _correction_dim(cfg.yarn_beta_fast, dim, base, context)
    high = _correction_dim(cfg.yarn_beta_slow, dim, base, context)
    if cfg.yarn_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width
    steps = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu")
    extrapolated = 1.0 / base ** (steps / dim)
    interpolated = extrapolated / factor
    pair = torch.arange(dim // 2, dtype=torch.float64, device="cpu")
    ramp = ((pair - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: keep the original frequency
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    scale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, scale


class YarnRotaryEmbedding(RotaryEmbedding):
    """`RotaryEmbedding`'s tables with YaRN's frequencies and cos/sin scale."""

    frequencies = staticmethod(yarn_frequencies)

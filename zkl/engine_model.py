"""The model of the configured engine (`engine.name`, `zkl.engines`), built in one place.

Both the trainer and a dedicated generator build their model here, so the native model
families never depend on megatron-core.
"""

from __future__ import annotations

import torch

from zkl.engines import NATIVE, engine_named
from zkl.models.build import build_model
from zkl.models.config import ModelConfig


def build_engine_model(
    cfg: ModelConfig,
    compute_dtype: torch.dtype,
    linear_quant: str,
    seed: int,
    device: torch.device | str,
    engine: str = NATIVE.name,
) -> torch.nn.Module:
    """The model `engine` builds on `device` in its compute dtype, from the same seeded
    weights (or `cfg.checkpoint`) whichever engine builds it."""
    if engine_named(engine).builds_native:
        return build_model(cfg, compute_dtype, linear_quant, seed, device)
    # megatron-core is optional (CUDA, Python >= 3.12): imported only for a megatron engine
    from zkl.megatron.model import build_megatron_model

    return build_megatron_model(cfg, engine, compute_dtype, seed, device)

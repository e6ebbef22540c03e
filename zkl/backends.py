"""`engine.backend`: which implementation builds the model, zkl's native one or megatron-core's.

Both the trainer and a dedicated generator build their model here, so the choice is made
in one place and the native model family never depends on megatron-core.
"""

from __future__ import annotations

import torch

from zkl.models.build import build_model
from zkl.models.config import ModelConfig


def build_backend_model(
    cfg: ModelConfig,
    compute_dtype: torch.dtype,
    linear_quant: str,
    seed: int,
    device: torch.device | str,
    backend: str = "native",
) -> torch.nn.Module:
    """The model of `backend` on `device` in its compute dtype, from the same seeded weights
    (or `cfg.checkpoint`) whichever backend builds it."""
    if backend == "native":
        return build_model(cfg, compute_dtype, linear_quant, seed, device)
    # megatron-core is optional (CUDA, Python >= 3.12): imported only for a megatron backend
    from zkl.megatron.model import build_megatron_model

    return build_megatron_model(cfg, backend, compute_dtype, seed, device)

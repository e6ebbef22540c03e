"""`build_model`: a native model on its device, seeded or loaded, in its precision recipe."""

from __future__ import annotations

import torch

from zkl.models.config import ModelConfig
from zkl.models.hf_checkpoint import load_state_dict
from zkl.models.nemotron_h import NemotronH
from zkl.models.registry import family, validate_model
from zkl.models.transformer import Transformer
from zkl.precision.recipes import apply_precision

__all__ = [
    "ModelConfig",
    "NemotronH",
    "Transformer",
    "build_model",
    "validate_model",
]


def build_model(
    cfg: ModelConfig,
    compute_dtype: torch.dtype,
    linear_quant: str = "none",
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> torch.nn.Module:
    """The model on `device` in its compute dtype: seeded random init, or `cfg.checkpoint`.

    Parameters are created, initialised or loaded on the device itself (no CPU copy of the
    weights on the way).
    """
    entry = family(cfg)
    with torch.device(device):
        model = entry.model_class(cfg)
    if cfg.checkpoint:
        model.load_state_dict(load_state_dict(cfg.checkpoint, cfg, device), strict=True)
    else:
        entry.init_weights(model, seed)
    apply_precision(model, compute_dtype, linear_quant)
    return model.to(device)  # the rotary tables (Qwen), built on the CPU

"""Native model families: Qwen2, Qwen3 dense, Qwen3-MoE, Nemotron-H hybrid, gpt-oss."""

from __future__ import annotations

import torch

from zkl.models.config import ModelConfig, validate_model
from zkl.models.families import model_class
from zkl.models.hf_checkpoint import load_state_dict
from zkl.models.nemotron_h import NemotronH, init_hybrid_weights
from zkl.models.transformer import Transformer, init_weights
from zkl.precision import apply_precision

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
    with torch.device(device):
        model = model_class(cfg)(cfg)
    if cfg.checkpoint:
        model.load_state_dict(load_state_dict(cfg.checkpoint, cfg, device), strict=True)
    elif cfg.family == "nemotron_h":
        init_hybrid_weights(model, seed)
    else:
        init_weights(model, seed)
    apply_precision(model, compute_dtype, linear_quant)
    return model.to(device)  # the rotary tables (Qwen), built on the CPU

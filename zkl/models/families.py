"""Which native architecture a model config builds."""

from __future__ import annotations

from torch import nn

from zkl.models.config import ModelConfig
from zkl.models.gpt_oss import GptOss
from zkl.models.nemotron_h import NemotronH
from zkl.models.transformer import Transformer


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    """The architecture of `cfg.family`."""
    return {"nemotron_h": NemotronH, "gpt_oss": GptOss}.get(cfg.family, Transformer)

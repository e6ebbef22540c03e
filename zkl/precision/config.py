"""The precision part's config (conf/precision) and its check, a leaf of the schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zkl.errors import ConfigError, from_checkpoint

MX_BLOCK = 32  # an MXFP8 scale covers 32 elements along K


@dataclass
class PrecisionConfig:
    name: str = "bf16"
    compute_dtype: str = "bfloat16"  # bfloat16 | float16 (zkl/precision/fp16.py) | float32
    linear_quant: str = "none"  # none | mxfp8 | fp8_tensor
    master_weights_fp32: bool = True  # fp32 copy for the optimizer when compute is bf16
    native: bool = False  # native MXFP8 GEMMs (Transformer Engine on Blackwell)


def quantizes(precision: PrecisionConfig) -> bool:
    """Whether the recipe fake-quantizes the Linear layers (`precision.linear_quant`), asked of
    the config before a model exists (`zkl.precision.recipes.quantizes` asks a built model)."""
    return precision.linear_quant != "none"


def check(precision: PrecisionConfig, model: Any) -> None:
    """One sentence naming the precision.* key that cannot work, or the `model.*` size that
    MXFP8's 32-element blocks cannot tile."""
    if precision.compute_dtype not in ("bfloat16", "float16", "float32"):
        raise ConfigError(
            f"precision.compute_dtype={precision.compute_dtype!r} must be bfloat16, float16 or "
            "float32."
        )
    if precision.linear_quant not in ("none", "mxfp8", "fp8_tensor"):
        raise ConfigError(
            f"precision.linear_quant={precision.linear_quant!r} must be none, mxfp8 or fp8_tensor."
        )
    if precision.native:
        raise ConfigError(
            "precision.native=true needs Transformer Engine's MXFP8 GEMMs on a Blackwell GPU, "
            "which this machine lacks; set precision.native=false to use the exact emulation."
        )
    if precision.linear_quant == "mxfp8":
        _check_mx_shapes(model)


def _check_mx_shapes(model: Any) -> None:
    """Every GEMM's K (the input width of each quantized linear) a whole number of blocks."""
    by = from_checkpoint(model)  # the key the user set, when a checkpoint set the sizes
    dense = any(not model.layer_is_moe(i) for i in range(model.num_hidden_layers))
    for key in ("hidden_size", "intermediate_size") if dense else ("hidden_size",):
        if getattr(model, key) % MX_BLOCK:
            raise ConfigError(f"model.{key}{by} must be a multiple of 32 for precision=mxfp8.")
    if model.is_moe and model.moe.intermediate_size % MX_BLOCK:
        raise ConfigError(f"model.moe.intermediate_size{by} must be a multiple of 32 for mxfp8.")
    # Mamba's out_proj and a shared expert's down_proj (both widths are 0 where absent)
    if model.mamba.num_heads * model.mamba.head_dim % MX_BLOCK:
        raise ConfigError(
            f"model.mamba.num_heads * model.mamba.head_dim{by} must be a multiple of 32."
        )
    if model.moe.shared_expert_intermediate_size % MX_BLOCK:
        raise ConfigError(
            f"model.moe.shared_expert_intermediate_size{by} must be a multiple of 32."
        )
    if model.num_attention_heads * model.head_dim % MX_BLOCK:
        raise ConfigError(
            f"model.num_attention_heads * model.head_dim{by} must be a multiple of 32."
        )

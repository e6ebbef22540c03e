"""Reading an HF `config.json`: the parts every family shares (the family files read the rest)."""

from __future__ import annotations

import json
from pathlib import Path

from zkl.models.config import ModelConfig


def read_config(path: Path) -> dict:
    if not path.is_dir():
        raise ValueError(f"checkpoint {str(path)!r} is not a directory (need config.json).")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"checkpoint {str(path)!r} has no config.json.")
    with open(config_file) as f:
        return json.load(f)


def rope_parameters(hf: dict) -> dict:
    """transformers 5 `rope_parameters` or the legacy `rope_scaling` (with `rope_theta` top
    level), with `rope_type` always set."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise TypeError(f"config.json rope_parameters={params!r} is not a dict.")
    if "rope_theta" not in params and any(isinstance(v, dict) for v in params.values()):
        raise ValueError(
            "config.json has per-layer-type rope_parameters; zkl supports one RoPE per model."
        )
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor not in (None, 1, 1.0):
        raise ValueError(f"config.json partial_rotary_factor={factor} is not supported (need 1).")
    rope_type = params.get("rope_type", params.get("type")) or "default"
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    return dict(params, rope_type=rope_type, rope_theta=theta)


def check_rope_type(params: dict, supported: tuple[str, ...]) -> None:
    if params["rope_type"] not in supported:
        raise ValueError(
            f"config.json rope type {params['rope_type']!r} (rope scaling) is not supported "
            f"for this family; zkl implements {list(supported)}."
        )


def check_unquantized(hf: dict) -> None:
    if hf.get("quantization_config"):
        method = hf["quantization_config"].get("quant_method", "?")
        raise ValueError(f"quantized checkpoints ({method}) are not supported; use bf16/fp32.")


def check_silu(hf: dict) -> None:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json hidden_act={act!r} is not supported (SwiGLU with silu).")


def decoder_fields(hf: dict, base: ModelConfig) -> ModelConfig:
    """`base` with the sizes every decoder-only config.json names the same way."""
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    base.vocab_size = hf["vocab_size"]
    base.hidden_size = hidden
    base.num_hidden_layers = hf["num_hidden_layers"]
    base.num_attention_heads = heads
    base.num_key_value_heads = hf.get("num_key_value_heads") or heads
    base.head_dim = hf.get("head_dim") or hidden // heads
    base.intermediate_size = hf["intermediate_size"]
    base.max_position_embeddings = hf["max_position_embeddings"]
    # Default of the HF config classes of zkl's families when the key is absent.
    base.tie_word_embeddings = bool(hf.get("tie_word_embeddings", False))
    return base

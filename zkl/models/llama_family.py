"""The Llama and Mistral registry entries: zkl's `Transformer` without qk-norm, with Llama's
optional biases, its RoPE scaling (`linear`, `llama3`) and Mistral's sliding window."""

from __future__ import annotations

from zkl.models.config import ModelConfig, RopeConfig
from zkl.models.family import Family
from zkl.models.hf_config import (
    check_rope_type,
    check_silu,
    check_unquantized,
    decoder_fields,
    rope_parameters,
)
from zkl.models.transformer import Transformer, init_weights

ROPE_TYPES = ("default", "linear", "llama3")


def _config_from_hf(hf: dict, base: ModelConfig) -> ModelConfig:
    check_unquantized(hf)
    check_silu(hf)
    rope = rope_parameters(hf)
    check_rope_type(rope, ROPE_TYPES)
    cfg = decoder_fields(hf, base)
    cfg.rms_norm_eps = float(hf.get("rms_norm_eps", 1e-6))
    bias = bool(hf.get("attention_bias", False))  # q/k/v and o_proj alike
    cfg.qkv_bias, cfg.o_proj_bias, cfg.qk_norm = bias, bias, False
    cfg.mlp_bias = bool(hf.get("mlp_bias", False))
    cfg.rope = RopeConfig(type=rope["rope_type"], theta=rope["rope_theta"])
    if cfg.rope.type != "default":
        cfg.rope.factor = float(rope["factor"])
    if cfg.rope.type == "llama3":
        cfg.rope.low_freq_factor = float(rope["low_freq_factor"])
        cfg.rope.high_freq_factor = float(rope["high_freq_factor"])
        cfg.rope.original_max_position_embeddings = int(rope["original_max_position_embeddings"])
    window = hf.get("sliding_window") or 0
    if window and base.family != MISTRAL.name:
        raise ValueError(
            f"config.json sliding_window={window} for model_type {hf.get('model_type')!r}: "
            f"zkl reads a window for {MISTRAL.name} only."
        )
    # A window that covers every position is full attention (Mistral v0.2+ writes null).
    cfg.sliding_window = window if window < cfg.max_position_embeddings else 0
    return cfg


def _no_rules(cfg: ModelConfig) -> None:
    """Llama and Mistral have no rules of their own (they read no model.moe:
    `Family.sections`; Mistral's window is the shared `sliding_window`)."""


_COMMON = dict(
    model_class=Transformer,
    config_from_hf=_config_from_hf,
    validate=_no_rules,
    init_weights=init_weights,
    modules=("zkl/models/llama_family.py",),
)
LLAMA = Family(
    name="llama",
    model_types=("llama",),
    architectures=("LlamaForCausalLM",),
    **_COMMON,
)
MISTRAL = Family(
    name="mistral",
    model_types=("mistral",),
    architectures=("MistralForCausalLM",),
    capabilities=frozenset({"sliding_window"}),
    **_COMMON,
)

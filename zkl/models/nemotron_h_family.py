"""Nemotron-H's registry entry: the hybrid's config.json reader, its rules and HF's names."""

from __future__ import annotations

from zkl.models.config import (
    LAYER_KINDS,
    MambaConfig,
    ModelConfig,
    MoEConfig,
    check_divides,
    check_top_k,
)
from zkl.models.family import Family
from zkl.models.nemotron_h import NemotronH, init_hybrid_weights

# HF's layers_block_type names -> Megatron's pattern letters (as HF's own _list_to_pattern).
_HYBRID_LETTERS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*"}
_HYBRID_LETTERS |= {"mlp": "-", "moe": "E"}


def _config_from_hf(hf: dict, base: ModelConfig) -> ModelConfig:
    """The ModelConfig of a `NemotronHForCausalLM` config.json (transformers 5 or legacy keys)."""
    kinds = hf.get("layers_block_type") or hf.get("layer_types")
    pattern = hf.get("hybrid_override_pattern") or "".join(_HYBRID_LETTERS[k] for k in kinds or [])
    for key, ok in (
        ("attention_bias", False),
        ("mlp_bias", False),
        ("moe_latent_size", None),
        ("num_nextn_predict_layers", 0),
        ("quantization_config", None),
        ("sliding_window", None),
    ):
        if hf.get(key, ok) != ok:
            raise ValueError(f"config.json {key}={hf[key]!r} is not supported (need {ok!r}).")
    heads = hf["num_attention_heads"]
    moe = "E" in pattern
    cfg = base
    cfg.vocab_size = hf["vocab_size"]
    cfg.hidden_size = hf["hidden_size"]
    cfg.num_hidden_layers = len(pattern)
    cfg.hybrid_override_pattern = pattern
    cfg.num_attention_heads = heads
    cfg.num_key_value_heads = hf.get("num_key_value_heads") or heads
    cfg.head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    cfg.intermediate_size = hf["intermediate_size"]
    cfg.rms_norm_eps = float(hf.get("layer_norm_epsilon", 1e-5))
    cfg.max_position_embeddings = hf["max_position_embeddings"]
    cfg.qkv_bias, cfg.qk_norm = False, False
    cfg.tie_word_embeddings = bool(hf.get("tie_word_embeddings", False))
    cfg.mlp_hidden_act = hf.get("mlp_hidden_act", "relu2")
    cfg.mamba = MambaConfig(
        num_heads=hf["mamba_num_heads"],
        head_dim=hf["mamba_head_dim"],
        state_size=hf["ssm_state_size"],
        num_groups=hf.get("n_groups", hf.get("mamba_n_groups", 8)),
        conv_kernel=hf.get("conv_kernel", hf.get("mamba_d_conv", 4)),
        chunk_size=hf.get("chunk_size", hf.get("mamba_chunk_size", 128)),
        hidden_act=hf.get("mamba_hidden_act", "silu"),
        time_step_min=float(hf.get("time_step_min", hf.get("mamba_dt_min", 0.001))),
        conv_bias=bool(hf.get("use_conv_bias", hf.get("mamba_conv_bias", True))),
        proj_bias=bool(hf.get("use_bias", False)),  # what HF's mixer reads
    )
    cfg.moe = MoEConfig(
        num_experts=hf.get("n_routed_experts", 0) if moe else 0,
        num_experts_per_tok=hf.get("num_experts_per_tok", 0) if moe else 0,
        intermediate_size=hf.get("moe_intermediate_size", 0) if moe else 0,
        shared_expert_intermediate_size=hf.get("moe_shared_expert_intermediate_size", 0),
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        num_expert_groups=hf.get("n_group", 1),
        topk_expert_groups=hf.get("topk_group", 1),
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
    )
    return cfg


def _validate(cfg: ModelConfig) -> None:
    pattern = cfg.hybrid_override_pattern
    if not pattern or set(pattern) - set(LAYER_KINDS):
        raise ValueError(
            f"model.hybrid_override_pattern={pattern!r} must be a non-empty string of "
            f"{''.join(LAYER_KINDS)}."
        )
    if len(pattern) != cfg.num_hidden_layers:
        raise ValueError(
            f"model.num_hidden_layers={cfg.num_hidden_layers} must equal the length of "
            f"model.hybrid_override_pattern ({len(pattern)})."
        )
    mamba, moe = cfg.mamba, cfg.moe
    for key in ("num_heads", "head_dim", "state_size", "num_groups", "chunk_size"):
        if "M" in pattern and getattr(mamba, key) <= 0:
            raise ValueError(f"model.mamba.{key} must be positive for Mamba layers.")
    if "M" in pattern:
        check_divides(cfg, "mamba.num_groups", "mamba.num_heads")
    if mamba.conv_kernel < 2:
        raise ValueError(f"model.mamba.conv_kernel={mamba.conv_kernel} must be at least 2.")
    if cfg.qkv_bias or cfg.qk_norm:
        raise ValueError(f"model.qkv_bias and model.qk_norm must be false for {NEMOTRON_H.name}.")
    if mamba.hidden_act != "silu" or cfg.mlp_hidden_act != "relu2":
        raise ValueError("model.mamba.hidden_act must be silu and model.mlp_hidden_act relu2.")
    if "E" in pattern:
        check_top_k(cfg)
        if moe.intermediate_size <= 0 or moe.shared_expert_intermediate_size <= 0:
            raise ValueError(
                "model.moe.intermediate_size and model.moe.shared_expert_intermediate_size "
                "must be positive for MoE layers."
            )
        groups, topk = moe.num_expert_groups, moe.topk_expert_groups
        if moe.num_experts % groups or not 0 < topk <= groups:
            raise ValueError(
                f"model.moe.num_expert_groups={groups} must divide model.moe.num_experts and "
                f"model.moe.topk_expert_groups={topk} must be between 1 and num_expert_groups."
            )
        reachable = topk * (moe.num_experts // groups)
        if moe.num_experts_per_tok > reachable:
            raise ValueError(
                f"model.moe.num_experts_per_tok={moe.num_experts_per_tok} is more than the "
                f"{reachable} experts of the model.moe.topk_expert_groups={topk} groups a "
                "token may route to."
            )


NEMOTRON_H = Family(
    name="nemotron_h",
    model_class=NemotronH,
    model_types=("nemotron_h",),
    architectures=("NemotronHForCausalLM",),
    config_from_hf=_config_from_hf,
    validate=_validate,
    init_weights=init_hybrid_weights,
    modules=(
        "zkl/models/nemotron_h_family.py",
        "zkl/models/nemotron_h.py",
        "zkl/models/mamba2.py",
    ),
    # HF keeps the stack under `backbone.` with `embeddings` and `norm_f`
    renames=(("backbone.", ""), ("embeddings.", "embed_tokens."), ("norm_f.", "norm.")),
    cache="hybrid",
    capabilities=frozenset({"moe", "mamba"}),
    sections=frozenset({"moe", "mamba"}),  # attention without RoPE
)

"""The Qwen families' registry entries: Qwen2, Qwen3 dense and Qwen3-MoE (one `Transformer`)."""

from __future__ import annotations

from zkl.models.config import ModelConfig, MoEConfig, check_top_k
from zkl.models.family import Family
from zkl.models.hf_config import (
    check_rope_type,
    check_silu,
    check_unquantized,
    decoder_fields,
    rope_parameters,
)
from zkl.models.transformer import Transformer, init_weights


def _config_from_hf(hf: dict, base: ModelConfig) -> ModelConfig:
    check_unquantized(hf)
    if hf.get("use_sliding_window"):
        raise ValueError(
            "config.json use_sliding_window=true: Qwen's sliding-window attention is not supported."
        )
    if any(t != "full_attention" for t in hf.get("layer_types") or []):
        raise ValueError(
            f"config.json layer_types={hf['layer_types']} has non-full attention layers; "
            "zkl supports full attention only for Qwen."
        )
    check_silu(hf)
    rope = rope_parameters(hf)
    check_rope_type(rope, ("default",))
    cfg = decoder_fields(hf, base)
    cfg.rope.theta = rope["rope_theta"]
    cfg.rms_norm_eps = float(hf.get("rms_norm_eps", 1e-6))
    if base.family == QWEN2.name:
        cfg.qkv_bias, cfg.qk_norm = True, False  # Qwen2 hard-codes q/k/v bias, none on o_proj
        return cfg
    if hf.get("attention_bias", False):
        # HF Qwen3 puts `bias=attention_bias` on o_proj as well; zkl's Qwen has none there.
        raise ValueError(
            f"config.json attention_bias=true is not supported for {base.family}: it also "
            "adds an o_proj bias, which zkl's Qwen attention does not have."
        )
    cfg.qkv_bias, cfg.qk_norm = False, True
    if base.family == QWEN3_MOE.name:
        # transformers 5 writes `num_local_experts` (attribute_map of num_experts).
        num_experts = hf.get("num_experts", hf.get("num_local_experts"))
        if not num_experts:
            raise ValueError(f"config.json of a {base.family} model has no num_experts.")
        cfg.moe = MoEConfig(
            num_experts=num_experts,
            num_experts_per_tok=hf["num_experts_per_tok"],
            intermediate_size=hf["moe_intermediate_size"],
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),  # HF default: false
            decoder_sparse_step=hf.get("decoder_sparse_step", 1),
            mlp_only_layers=list(hf.get("mlp_only_layers") or []),
        )
    return cfg


def _config_to_hf(cfg: ModelConfig) -> dict:
    """The config.json `_config_from_hf` reads back into `cfg`'s numbers."""
    hf = {
        "hidden_act": "silu",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_theta": cfg.rope.theta,
        "rms_norm_eps": cfg.rms_norm_eps,
    }
    if cfg.family == QWEN3_MOE.name:
        moe = cfg.moe
        hf.update(
            num_experts=moe.num_experts,
            num_experts_per_tok=moe.num_experts_per_tok,
            moe_intermediate_size=moe.intermediate_size,
            norm_topk_prob=moe.norm_topk_prob,
            decoder_sparse_step=moe.decoder_sparse_step,
            mlp_only_layers=list(moe.mlp_only_layers),
        )
    return hf


def _validate_moe(cfg: ModelConfig) -> None:
    if cfg.moe.num_experts <= 0:
        raise ValueError(f"model.moe.num_experts must be positive for model.family={cfg.family!r}.")
    check_top_k(cfg)
    if cfg.moe.intermediate_size <= 0:
        raise ValueError("model.moe.intermediate_size must be positive for a MoE model.")


def _no_rules(cfg: ModelConfig) -> None:
    """A dense Qwen has no rules of its own (it reads no model.moe: `Family.sections`)."""


_COMMON = dict(
    model_class=Transformer,
    config_from_hf=_config_from_hf,
    config_to_hf=_config_to_hf,
    init_weights=init_weights,
    modules=("zkl/models/qwen_family.py",),
    megatron=True,
)
QWEN2 = Family(
    name="qwen2",
    model_types=("qwen2",),
    architectures=("Qwen2ForCausalLM",),
    validate=_no_rules,
    **_COMMON,
)
QWEN3 = Family(
    name="qwen3",
    model_types=("qwen3",),
    architectures=("Qwen3ForCausalLM",),
    validate=_no_rules,
    **_COMMON,
)
QWEN3_MOE = Family(
    name="qwen3_moe",
    model_types=("qwen3_moe",),
    architectures=("Qwen3MoeForCausalLM",),
    validate=_validate_moe,
    capabilities=frozenset({"moe", "route_replay"}),
    sections=frozenset({"rope", "moe"}),
    **_COMMON,
)

"""The architecture numbers of one model, as data (one dataclass for every native family)."""

from __future__ import annotations

from dataclasses import dataclass, field

FAMILIES = ("qwen2", "qwen3", "qwen3_moe")


@dataclass
class ModelConfig:
    """Numbers of a Qwen2 / Qwen3 / Qwen3-MoE decoder, named as in HF `config.json`."""

    name: str = "tiny_dense"
    family: str = "qwen3"  # qwen2 | qwen3 | qwen3_moe
    vocab_size: int = 64
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 256
    qkv_bias: bool = False  # Qwen2: true
    qk_norm: bool = True  # Qwen3: true
    tie_word_embeddings: bool = True
    # MoE (qwen3_moe); num_experts 0 means dense.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    init_std: float = 0.02
    # Where real weights come from: a directory with config.json + safetensors, or null for
    # seeded random init.
    checkpoint: str | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_moe(self, layer: int) -> bool:
        """Qwen3-MoE's rule: sparse every `decoder_sparse_step` layers unless listed dense."""
        return (
            self.is_moe
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )


def validate_model(cfg: ModelConfig) -> None:
    """Raise ValueError with one sentence naming the key to change."""
    if cfg.family not in FAMILIES:
        raise ValueError(f"model.family={cfg.family!r} is not one of {list(FAMILIES)}.")
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "max_position_embeddings",
    ):
        if getattr(cfg, key) <= 0:
            raise ValueError(f"model.{key}={getattr(cfg, key)} must be positive.")
    if cfg.rope_theta <= 0 or cfg.rms_norm_eps <= 0:
        raise ValueError("model.rope_theta and model.rms_norm_eps must be positive.")
    if cfg.head_dim % 2:
        raise ValueError(f"model.head_dim={cfg.head_dim} must be even (rotary embedding pairs).")
    if cfg.init_std <= 0:
        raise ValueError(f"model.init_std={cfg.init_std} must be positive.")
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(
            f"model.num_attention_heads={cfg.num_attention_heads} must divide "
            f"model.hidden_size={cfg.hidden_size}."
        )
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(
            f"model.num_key_value_heads={cfg.num_key_value_heads} must divide "
            f"model.num_attention_heads={cfg.num_attention_heads}."
        )
    if cfg.family != "qwen3_moe" and cfg.num_experts:
        raise ValueError(f"model.num_experts must be 0 for model.family={cfg.family!r}.")
    if cfg.family == "qwen3_moe":
        if cfg.num_experts <= 0:
            raise ValueError("model.num_experts must be positive for model.family='qwen3_moe'.")
        if not 0 < cfg.num_experts_per_tok <= cfg.num_experts:
            raise ValueError(
                f"model.num_experts_per_tok={cfg.num_experts_per_tok} must be between 1 and "
                f"model.num_experts={cfg.num_experts}."
            )
        if cfg.moe_intermediate_size <= 0:
            raise ValueError("model.moe_intermediate_size must be positive for a MoE model.")
        if cfg.decoder_sparse_step <= 0:
            raise ValueError("model.decoder_sparse_step must be positive.")

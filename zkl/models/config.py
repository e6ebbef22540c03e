"""The architecture numbers of one model, as data (one dataclass for every native family)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from zkl.errors import ConfigError

# Megatron's hybrid pattern letters: Mamba2, attention, MLP, MoE.
LAYER_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}

# The sizes that fix a dense model's tensor shapes: each must be positive.
SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)

# Sizes and counts that shape, divide or step something in every family: 0 is never a model.
AT_LEAST_ONE = (
    *SHAPE_KEYS,
    "max_position_embeddings",
    "decoder_sparse_step",
    "n_groups",
    "n_group",
    "topk_group",
)


@dataclass
class ModelConfig:
    """Numbers of a model of any native family, named as in HF `config.json`."""

    name: str = "tiny_dense"
    family: str = "qwen3"  # a name in zkl.models.registry.FAMILIES
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
    o_proj_bias: bool = False  # Llama's attention_bias puts a bias on q/k/v and o_proj
    mlp_bias: bool = False  # Llama's mlp_bias: gate/up/down biases
    qk_norm: bool = True  # Qwen3: true
    tie_word_embeddings: bool = True
    # RoPE scaling (zkl.models.rope.ROPE_TYPES): default | linear | llama3
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_original_max_position_embeddings: int = 0  # llama3
    # Sliding-window attention: a query at p sees the keys p-W+1..p; 0 is full attention.
    sliding_window: int = 0
    # MoE (qwen3_moe); num_experts 0 means dense.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    # Nemotron-H hybrid (family nemotron_h): one letter per layer, Megatron's notation
    # (M Mamba2, * attention, - MLP, E MoE); attention has no RoPE, MLPs are relu^2 non-gated.
    hybrid_override_pattern: str = ""
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    n_groups: int = 1
    conv_kernel: int = 4
    chunk_size: int = 0
    mamba_hidden_act: str = "silu"
    time_step_min: float = 0.001  # HF clamps dt below at this value (upper limit: none)
    use_conv_bias: bool = True
    mamba_proj_bias: bool = False  # HF's `use_bias` on in_proj / out_proj
    mlp_hidden_act: str = "relu2"
    n_routed_experts: int = 0
    moe_shared_expert_intermediate_size: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    # gpt-oss (`zkl.models.gpt_oss`): learned attention sinks, layers of HF's `layer_types`
    # (only sliding_attention layers see the last `sliding_window` keys; empty: every layer
    # does), YaRN RoPE (yarn_factor 1: no scaling) and the clamped SwiGLU experts.
    attention_sinks: bool = False
    layer_types: list[str] = field(default_factory=list)
    yarn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_truncate: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    init_std: float = 0.02
    # Where real weights come from: a directory with config.json + safetensors, or null for
    # seeded random init.
    checkpoint: str | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 or self.n_routed_experts > 0

    def layer_kind(self, layer: int) -> str:
        """mamba | attention | mlp | moe for a hybrid; attention blocks for the Qwen families."""
        return LAYER_KINDS[self.hybrid_override_pattern[layer]]

    def layer_window(self, layer: int) -> int:
        """The attention window of `layer` (0: full attention); with `layer_types`, only
        sliding_attention layers have one."""
        if self.layer_types and self.layer_types[layer] != "sliding_attention":
            return 0
        return self.sliding_window

    def layer_is_moe(self, layer: int) -> bool:
        """A hybrid pattern's letter, or Qwen3-MoE's rule: sparse every `decoder_sparse_step`
        layers unless listed dense."""
        if self.hybrid_override_pattern:
            return self.layer_kind(layer) == "moe"
        return (
            self.is_moe
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )


def validate_shapes(cfg: ModelConfig) -> None:
    """The rules every family shares; ValueError with one sentence naming the key to change.
    (`zkl.models.registry.validate_model` adds the family's own.) No torch: an entry point
    runs these before torch loads."""
    check_signs(cfg)
    if cfg.head_dim % 2:
        raise ValueError(f"model.head_dim={cfg.head_dim} must be even (rotary embedding pairs).")
    check_divides(cfg, "num_attention_heads", "hidden_size")
    check_divides(cfg, "num_key_value_heads", "num_attention_heads")
    if not 0 <= cfg.sliding_window <= cfg.max_position_embeddings:
        # W >= the context is full attention; a larger W than the context is a slip
        raise ValueError(
            f"model.sliding_window={cfg.sliding_window} must be between 0 (full attention) "
            f"and model.max_position_embeddings={cfg.max_position_embeddings}."
        )


def check_signs(cfg: ModelConfig) -> None:
    """By type, for every family: each float (a scale, a rate, an epsilon, a clamp) above zero,
    each count or size at least zero (those in AT_LEAST_ONE at least one), each listed layer
    a layer of the model; the family rules then divide and compare safely."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, bool):
            continue
        if isinstance(value, float) and not value > 0:
            raise ValueError(f"model.{f.name}={value} must be positive.")
        positive = f.name in AT_LEAST_ONE
        if isinstance(value, int) and value < int(positive):
            raise ValueError(
                f"model.{f.name}={value} must be {'positive' if positive else '>= 0'}."
            )
    for layer in cfg.mlp_only_layers:
        if not 0 <= layer < cfg.num_hidden_layers:
            raise ValueError(
                f"model.mlp_only_layers holds {layer}, not a layer of the "
                f"model.num_hidden_layers={cfg.num_hidden_layers}."
            )


def check_dense(cfg: ModelConfig) -> None:
    """A family without Qwen3-MoE's experts keeps `num_experts` at 0."""
    if cfg.num_experts:
        raise ValueError(f"model.num_experts must be 0 for model.family={cfg.family!r}.")


def check_no_routed_experts(cfg: ModelConfig) -> None:
    """`n_routed_experts` counts a hybrid's experts; another family's are `num_experts`."""
    if cfg.n_routed_experts:
        raise ValueError(
            f"model.n_routed_experts must be 0 for model.family={cfg.family!r} (its experts "
            "are model.num_experts)."
        )


def check_plain_dense(cfg: ModelConfig) -> None:
    """A dense transformer family: no experts of either kind."""
    check_dense(cfg)
    check_no_routed_experts(cfg)


def check_divides(cfg: ModelConfig, part: str, whole: str) -> None:
    if getattr(cfg, whole) % getattr(cfg, part):
        raise ValueError(
            f"model.{part}={getattr(cfg, part)} must divide model.{whole}={getattr(cfg, whole)}."
        )


def check_top_k(cfg: ModelConfig, experts: str) -> None:
    """Each token picks `num_experts_per_tok` of the `experts` routed experts."""
    if not 0 < cfg.num_experts_per_tok <= getattr(cfg, experts):
        raise ValueError(
            f"model.num_experts_per_tok={cfg.num_experts_per_tok} must be between 1 and "
            f"model.{experts}={getattr(cfg, experts)}."
        )


def model_named(cfg: ModelConfig) -> str:
    """The model as a refusal names it: the checkpoint the user gave, else its group."""
    return f"model.checkpoint={cfg.checkpoint}" if cfg.checkpoint else f"model={cfg.name}"


def check_positions(cfg: ModelConfig, positions: int, needed_by: str) -> None:
    """The one position limit, wherever a sequence's length is first known (the run's
    config, the scheduler's requests, the train path's forward): ConfigError when `positions`
    exceed `model.max_position_embeddings` (the rotary tables are read unchecked)."""
    if positions <= cfg.max_position_embeddings:
        return
    short = (
        f"model.max_position_embeddings={cfg.max_position_embeddings} is shorter than the "
        f"{positions} positions {needed_by}"
    )
    if cfg.checkpoint:  # a checkpoint's context is its config.json's, or shorter
        raise ConfigError(
            f"{short}, and model.checkpoint={cfg.checkpoint} allows no more than its "
            "config.json's; shorten the prompts or sampling.max_new_tokens."
        )
    raise ConfigError(f"{short}; raise it.")

"""The architecture numbers of one model, as data: the numbers every native family reads,
and the sections only some read (`rope`, `moe`, `mamba`; each family's registry entry names
its own, `Family.sections`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

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
    "moe.decoder_sparse_step",
    "moe.num_expert_groups",
    "moe.topk_expert_groups",
    "mamba.num_groups",
)


@dataclass
class RopeConfig:
    """`model.rope`: the rotary embedding, its scaling one rule of `zkl.models.rope.ROPE_TYPES`
    (default | linear | llama3 | yarn). `factor` scales the context (linear, llama3, yarn);
    llama3 interpolates between `low_freq_factor` and `high_freq_factor`, YaRN ramps between
    `beta_fast` and `beta_slow` rotations (`truncate`: to whole dimensions); both measure
    wavelengths against `original_max_position_embeddings`."""

    type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = False


@dataclass
class MoEConfig:
    """`model.moe`: the routed experts of an MoE family; `num_experts` 0 is a dense model.

    Qwen3-MoE makes a layer sparse every `decoder_sparse_step` layers unless it is listed in
    `mlp_only_layers`; Nemotron-H adds a shared expert, scales the routed output and routes
    group-limited (`topk_expert_groups` of `num_expert_groups` groups); gpt-oss clamps its
    SwiGLU experts (`swiglu_alpha`, `swiglu_limit`).
    """

    num_experts: int = 0
    num_experts_per_tok: int = 0
    intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    shared_expert_intermediate_size: int = 0
    routed_scaling_factor: float = 1.0
    num_expert_groups: int = 1
    topk_expert_groups: int = 1
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


@dataclass
class MambaConfig:
    """`model.mamba`: Nemotron-H's Mamba2 mixers (heads of `head_dim`, an SSM state of
    `state_size` per head, B and C shared by `num_groups` groups of heads, a causal conv of
    `conv_kernel`, the chunked scan in chunks of `chunk_size`)."""

    num_heads: int = 0
    head_dim: int = 0
    state_size: int = 0
    num_groups: int = 1
    conv_kernel: int = 4
    chunk_size: int = 0
    hidden_act: str = "silu"
    time_step_min: float = 0.001  # HF clamps dt below at this value (upper limit: none)
    conv_bias: bool = True
    proj_bias: bool = False  # HF's `use_bias` on in_proj / out_proj


SECTIONS = ("rope", "moe", "mamba")


@dataclass
class ModelConfig:
    """Numbers of a model of any native family, named as in HF `config.json` (the sections'
    within their section)."""

    name: str = "tiny_dense"
    family: str = "qwen3"  # a name in zkl.models.registry.FAMILIES
    vocab_size: int = 64
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 256
    qkv_bias: bool = False  # Qwen2: true
    o_proj_bias: bool = False  # Llama's attention_bias puts a bias on q/k/v and o_proj
    mlp_bias: bool = False  # Llama's mlp_bias: gate/up/down biases
    qk_norm: bool = True  # Qwen3: true
    tie_word_embeddings: bool = True
    # Sliding-window attention: a query at p sees the keys p-W+1..p; 0 is full attention.
    sliding_window: int = 0
    # gpt-oss: HF's `layer_types` (only sliding_attention layers see the last
    # `sliding_window` keys; empty: every layer does) and learned attention sinks.
    layer_types: list[str] = field(default_factory=list)
    attention_sinks: bool = False
    # Nemotron-H hybrid (family nemotron_h): one letter per layer, Megatron's notation
    # (M Mamba2, * attention, - MLP, E MoE); attention has no RoPE, MLPs are relu^2 non-gated.
    hybrid_override_pattern: str = ""
    mlp_hidden_act: str = "relu2"
    init_std: float = 0.02
    # Where real weights come from: a directory with config.json + safetensors, or null for
    # seeded random init.
    checkpoint: str | None = None
    rope: RopeConfig = field(default_factory=RopeConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    mamba: MambaConfig = field(default_factory=MambaConfig)

    @property
    def is_moe(self) -> bool:
        return self.moe.num_experts > 0

    def layer_kind(self, layer: int) -> str:
        """mamba | attention | mlp | moe for a hybrid; attention blocks for the Qwen families."""
        return LAYER_KINDS[self.hybrid_override_pattern[layer]]

    def has_layer(self, kind: str) -> bool:
        """Whether any layer is of `kind` (mamba | moe): a hybrid's pattern, else the MoE rule."""
        if self.hybrid_override_pattern:
            letters = self.hybrid_override_pattern[: self.num_hidden_layers]
            return any(LAYER_KINDS[c] == kind for c in letters if c in LAYER_KINDS)
        return kind == "moe" and any(map(self.layer_is_moe, range(self.num_hidden_layers)))

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
            and layer not in self.moe.mlp_only_layers
            and (layer + 1) % self.moe.decoder_sparse_step == 0
        )


def leaves(schema: type = ModelConfig) -> list[tuple[str, dataclasses.Field]]:
    """Every field of the model config as (key, field), a section's under its dotted key
    (`moe.num_experts`)."""
    out = []
    for f in fields(schema):
        if f.name in SECTIONS:
            out += [(f"{f.name}.{g.name}", g) for g in fields(type(f.default_factory()))]
        else:
            out.append((f.name, f))
    return out


def value_at(cfg: Any, key: str) -> Any:
    """The value of dotted `key` (`moe.num_experts`) in a model config or its Hydra node."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def replaced(cfg: ModelConfig, changes: dict[str, Any]) -> ModelConfig:
    """A copy of `cfg` with each dotted key of `changes` (`moe.num_experts`) set."""
    out = dataclasses.replace(cfg)
    for key, value in changes.items():
        section, _, leaf = key.rpartition(".")
        if section:
            setattr(out, section, dataclasses.replace(getattr(out, section), **{leaf: value}))
        else:
            setattr(out, leaf, value)
    return out


def from_tree(tree: dict[str, Any]) -> ModelConfig:
    """A ModelConfig from its nested dict (`dataclasses.asdict`'s form)."""
    sections = {
        f.name: type(f.default_factory())(**tree.get(f.name, {}))
        for f in fields(ModelConfig)
        if f.name in SECTIONS
    }
    plain = {k: v for k, v in tree.items() if k not in SECTIONS}
    return ModelConfig(**plain, **sections)


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
    for key, _ in leaves():
        value = value_at(cfg, key)
        if isinstance(value, bool):
            continue
        if isinstance(value, float) and not value > 0:
            raise ValueError(f"model.{key}={value} must be positive.")
        positive = key in AT_LEAST_ONE
        if isinstance(value, int) and value < int(positive):
            raise ValueError(f"model.{key}={value} must be {'positive' if positive else '>= 0'}.")
    for layer in cfg.moe.mlp_only_layers:
        if not 0 <= layer < cfg.num_hidden_layers:
            raise ValueError(
                f"model.moe.mlp_only_layers holds {layer}, not a layer of the "
                f"model.num_hidden_layers={cfg.num_hidden_layers}."
            )


def check_sections(cfg: ModelConfig, read: frozenset[str]) -> None:
    """A section its family does not `read` (`Family.sections`) stays at its defaults: a value
    set there would be ignored."""
    for name in SECTIONS:
        if name in read:
            continue
        section = getattr(cfg, name)
        for f in fields(section):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            if getattr(section, f.name) != default:
                raise ValueError(
                    f"model.{name}.{f.name}={getattr(section, f.name)!r} is set, but "
                    f"model.family={cfg.family!r} reads no model.{name}; leave it at {default!r}."
                )


def check_divides(cfg: ModelConfig, part: str, whole: str) -> None:
    """Dotted keys `part` and `whole`: the one divides the other."""
    if value_at(cfg, whole) % value_at(cfg, part):
        raise ValueError(
            f"model.{part}={value_at(cfg, part)} must divide model.{whole}={value_at(cfg, whole)}."
        )


def check_top_k(cfg: ModelConfig) -> None:
    """Each token picks `moe.num_experts_per_tok` of the `moe.num_experts` routed experts."""
    moe = cfg.moe
    if not 0 < moe.num_experts_per_tok <= moe.num_experts:
        raise ValueError(
            f"model.moe.num_experts_per_tok={moe.num_experts_per_tok} must be between 1 and "
            f"model.moe.num_experts={moe.num_experts}."
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

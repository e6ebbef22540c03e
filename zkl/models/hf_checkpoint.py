"""Read a Hugging Face Qwen2 / Qwen3 / Qwen3-MoE / Nemotron-H checkpoint into zkl's names.

A checkpoint is a directory with `config.json` and `*.safetensors` (one file, or shards listed
in `model.safetensors.index.json`). zkl's parameter names are HF's without the `model.`
prefix, except that zkl fuses q/k/v (`qkv_proj`) and gate/up (`gate_up_proj`), which HF
stores as separate projections: names and shapes are checked in HF's separate form, then the
parts are concatenated (`zkl.models.fused`). The MoE experts may be stored per expert (the layout
of released Qwen3-MoE checkpoints and what `save_pretrained` of transformers 5 writes, since
it converts back on save) or fused as in transformers 5's in-memory module
(`mlp.experts.gate_up_proj` [E, 2*I, H] with gate rows first, `mlp.experts.down_proj`
[E, H, I]; the transposed forms [E, H, 2*I] / [E, I, H] are accepted too).

Nemotron-H (`NemotronHForCausalLM`): HF keeps the stack under `backbone.` with `embeddings`
and `norm_f`, which zkl calls `embed_tokens` and `norm`; experts are stored per expert.

Nothing here imports transformers: the reader is plain JSON + safetensors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from zkl.models.config import ModelConfig, validate_model
from zkl.models.families import model_class
from zkl.models.fused import Layout, fused_layout, join_fused, split_fused
from zkl.models.gpt_oss_family import config_from_hf as gpt_oss_config
from zkl.models.gpt_oss_family import convert as gpt_oss_convert
from zkl.models.gpt_oss_family import validate as gpt_oss_validate

SUPPORTED = ("qwen2", "qwen3", "qwen3_moe", "nemotron_h", "gpt_oss")
# HF's layers_block_type names -> Megatron's pattern letters (as HF's own _list_to_pattern).
_HYBRID_LETTERS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*"}
_HYBRID_LETTERS |= {"mlp": "-", "moe": "E"}
_NEMOTRON_RENAMES = (("embeddings.", "embed_tokens."), ("norm_f.", "norm."))
INDEX_FILE = "model.safetensors.index.json"

# Keys some (older) checkpoints carry that are not weights: recomputed from the config.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_FUSED_EXPERTS = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def _read_config(path: Path) -> dict:
    if not path.is_dir():
        raise ValueError(f"checkpoint {str(path)!r} is not a directory (need config.json).")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"checkpoint {str(path)!r} has no config.json.")
    with open(config_file) as f:
        return json.load(f)


def _rope_theta(hf: dict) -> float:
    """rope_theta from transformers 5 `rope_parameters` or legacy `rope_theta`/`rope_scaling`."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise TypeError(f"config.json rope_parameters={params!r} is not a dict.")
    if "rope_theta" not in params and any(isinstance(v, dict) for v in params.values()):
        raise ValueError(
            "config.json has per-layer-type rope_parameters; zkl supports one default RoPE."
        )
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in (None, "default"):
        raise ValueError(
            f"config.json rope type {rope_type!r} (rope scaling) is not supported; zkl "
            "implements plain RoPE only (rope_type 'default')."
        )
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor not in (None, 1, 1.0):
        raise ValueError(f"config.json partial_rotary_factor={factor} is not supported (need 1).")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def model_config_from_hf(path: str | Path, name: str | None = None) -> ModelConfig:
    """The ModelConfig of an HF checkpoint directory (`checkpoint` set to `path`)."""
    path = Path(path)
    hf = _read_config(path)
    family = hf.get("model_type")
    if family not in SUPPORTED:
        raise ValueError(
            f"config.json model_type={family!r} is not supported; zkl reads {list(SUPPORTED)}."
        )
    if family == "nemotron_h":
        return _nemotron_config(hf, path, name)
    if family == "gpt_oss":
        base = ModelConfig(name=name or path.resolve().name, family=family, checkpoint=str(path))
        cfg = gpt_oss_config(hf, base)
        validate_model(cfg)
        gpt_oss_validate(cfg)
        return cfg
    if hf.get("quantization_config"):
        method = hf["quantization_config"].get("quant_method", "?")
        raise ValueError(f"quantized checkpoints ({method}) are not supported; use bf16/fp32.")
    if hf.get("use_sliding_window"):
        raise ValueError(
            "config.json use_sliding_window=true: sliding-window attention is not supported."
        )
    if any(t != "full_attention" for t in hf.get("layer_types") or []):
        raise ValueError(
            f"config.json layer_types={hf['layer_types']} has non-full attention layers; "
            "zkl supports full attention only."
        )
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json hidden_act={act!r} is not supported (SwiGLU with silu).")

    hidden = hf["hidden_size"]
    heads = hf["num_attention_heads"]
    if family == "qwen2":
        qkv_bias = True  # Qwen2 hard-codes bias on q/k/v (and none on o_proj)
        qk_norm = False
    else:
        if hf.get("attention_bias", False):
            # HF Qwen3 puts `bias=attention_bias` on o_proj as well; zkl's o_proj has no bias.
            raise ValueError(
                f"config.json attention_bias=true is not supported for {family}: it also adds "
                "an o_proj bias, which zkl's Attention does not have."
            )
        qkv_bias = False
        qk_norm = True
    cfg = ModelConfig(
        name=name or path.resolve().name,
        family=family,
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        intermediate_size=hf["intermediate_size"],
        rope_theta=_rope_theta(hf),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=hf["max_position_embeddings"],
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        # Default of all three HF config classes when the key is absent.
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        checkpoint=str(path),
    )
    if family == "qwen3_moe":
        # transformers 5 writes `num_local_experts` (attribute_map of num_experts).
        num_experts = hf.get("num_experts", hf.get("num_local_experts"))
        if not num_experts:
            raise ValueError("config.json of a qwen3_moe model has no num_experts.")
        cfg.num_experts = num_experts
        cfg.num_experts_per_tok = hf["num_experts_per_tok"]
        cfg.moe_intermediate_size = hf["moe_intermediate_size"]
        cfg.norm_topk_prob = bool(hf.get("norm_topk_prob", False))  # HF default: false
        cfg.decoder_sparse_step = hf.get("decoder_sparse_step", 1)
        cfg.mlp_only_layers = list(hf.get("mlp_only_layers") or [])
    validate_model(cfg)
    return cfg


def _nemotron_config(hf: dict, path: Path, name: str | None) -> ModelConfig:
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
    cfg = ModelConfig(
        name=name or path.resolve().name,
        family="nemotron_h",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_hidden_layers=len(pattern),
        hybrid_override_pattern=pattern,
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        intermediate_size=hf["intermediate_size"],
        rms_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        max_position_embeddings=hf["max_position_embeddings"],
        qkv_bias=False,
        qk_norm=False,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        mamba_num_heads=hf["mamba_num_heads"],
        mamba_head_dim=hf["mamba_head_dim"],
        ssm_state_size=hf["ssm_state_size"],
        n_groups=hf.get("n_groups", hf.get("mamba_n_groups", 8)),
        conv_kernel=hf.get("conv_kernel", hf.get("mamba_d_conv", 4)),
        chunk_size=hf.get("chunk_size", hf.get("mamba_chunk_size", 128)),
        mamba_hidden_act=hf.get("mamba_hidden_act", "silu"),
        time_step_min=float(hf.get("time_step_min", hf.get("mamba_dt_min", 0.001))),
        use_conv_bias=bool(hf.get("use_conv_bias", hf.get("mamba_conv_bias", True))),
        mamba_proj_bias=bool(hf.get("use_bias", False)),  # what HF's mixer reads
        mlp_hidden_act=hf.get("mlp_hidden_act", "relu2"),
        n_routed_experts=hf.get("n_routed_experts", 0) if "E" in pattern else 0,
        num_experts_per_tok=hf.get("num_experts_per_tok", 0) if "E" in pattern else 0,
        moe_intermediate_size=hf.get("moe_intermediate_size", 0) if "E" in pattern else 0,
        moe_shared_expert_intermediate_size=hf.get("moe_shared_expert_intermediate_size", 0),
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        n_group=hf.get("n_group", 1),
        topk_group=hf.get("topk_group", 1),
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
        checkpoint=str(path),
    )
    validate_model(cfg)
    return cfg


def _safetensors_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.is_file():
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise ValueError(f"{INDEX_FILE} in {str(path)!r} lists missing shards {missing}.")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"checkpoint {str(path)!r} has no *.safetensors file.")
    return files


def _read_tensors(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            names = f.keys()
            for key in names:
                if key in tensors:
                    raise ValueError(f"tensor {key!r} appears in more than one safetensors file.")
                tensors[key] = f.get_tensor(key)
    return tensors


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _per_expert(tensor: torch.Tensor, key: str, shape: tuple[int, int, int]) -> torch.Tensor:
    """`tensor` as [E, rows, cols] = `shape`: stored so, or as each expert's transpose (on a
    tie, as `shape`)."""
    e, rows, cols = shape
    if tuple(tensor.shape) == shape:
        return tensor
    if tuple(tensor.shape) == (e, cols, rows):
        return tensor.transpose(1, 2)
    raise ValueError(
        f"checkpoint tensor model.{key} has shape {list(tensor.shape)}; config.json implies "
        f"{list(shape)} (or {[e, cols, rows]})."
    )


def _unfuse_experts(
    key: str, tensor: torch.Tensor, cfg: ModelConfig, out: dict[str, torch.Tensor]
) -> None:
    """Split a transformers 5 fused experts tensor into per-expert HF names (gate_proj, up_proj,
    down_proj); the model's gate_up_proj joins gate and up again (`fused.join_fused`)."""
    layer, kind = _FUSED_EXPERTS.match(key).groups()
    prefix = f"layers.{layer}.mlp.experts"
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    if kind == "gate_up_proj":
        # transformers 5: [E, 2I, H], linear(x, W[e]).chunk(2) -> gate first; when 2I == H
        # the shape is ambiguous and this (the transformers 5) layout is taken.
        fused = _per_expert(tensor, key, (e, 2 * i, h))  # or the x @ W[e] form
        for x in range(e):
            out[f"{prefix}.{x}.gate_proj.weight"] = fused[x, :i]
            out[f"{prefix}.{x}.up_proj.weight"] = fused[x, i:]
    else:
        # transformers 5: linear(h, W[e]); preferred when H == I
        fused = _per_expert(tensor, key, (e, h, i))
        for x in range(e):
            out[f"{prefix}.{x}.down_proj.weight"] = fused[x]


def _layout(cfg: ModelConfig) -> tuple[dict[str, list[int]], Layout]:
    """Names and shapes of zkl's state dict for `cfg` with each fused tensor split into its
    parts (HF's names), and the fused layout; from the model itself (meta device)."""
    with torch.device("meta"):
        model = model_class(cfg)(cfg)
    layout = fused_layout(model)
    separate = split_fused(model.state_dict(), layout)
    return {k: list(v.shape) for k, v in separate.items()}, layout


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """zkl's state dict with q/k/v and gate/up split into HF's separate projections (views;
    no `model.` prefix): what an HF-format checkpoint of zkl's weights holds."""
    return split_fused(state, _layout(cfg)[1])


def _name_list(names: list[str], limit: int = 8) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def load_state_dict(
    path: str | Path, cfg: ModelConfig, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """All weights of the checkpoint under zkl's parameter names (q/k/v and gate/up fused),
    as fp32 tensors on `device`."""
    sd = map_state_dict(_read_tensors(Path(path), device), cfg, path)
    sd = {k: v.to(torch.float32).contiguous() for k, v in sd.items()}
    return join_fused(sd, _layout(cfg)[1])


def map_state_dict(
    raw: dict[str, torch.Tensor], cfg: ModelConfig, path: str | Path
) -> dict[str, torch.Tensor]:
    """Checkpoint tensors under zkl's names with fused projections still split (HF's separate
    q/k/v and gate/up), every name and shape checked against `cfg`.

    Works on meta tensors too, so the checkpoint check runs it on the headers alone.
    """
    sd: dict[str, torch.Tensor] = {}
    if cfg.family == "gpt_oss":
        raw = gpt_oss_convert({k.removeprefix("model."): v for k, v in raw.items()}, cfg)
    for hf_key, tensor in raw.items():
        key = hf_key.removeprefix("model.")
        if cfg.family == "nemotron_h":
            key = key.removeprefix("backbone.")
            for old, new in _NEMOTRON_RENAMES:
                if key.startswith(old):
                    key = new + key.removeprefix(old)
        if _IGNORED.search(key):
            continue
        if cfg.is_moe and _FUSED_EXPERTS.match(key):
            parts: dict[str, torch.Tensor] = {}
            _unfuse_experts(key, tensor, cfg, parts)
            clash = set(parts) & set(sd)
            if clash:
                raise ValueError(
                    f"checkpoint has experts both fused (model.{key}) and per expert "
                    f"({_name_list(list(clash), 2)})."
                )
            sd.update(parts)
            continue
        if key in sd:
            raise ValueError(
                f"checkpoint tensor {hf_key!r} maps to {key!r}, which another tensor already "
                "gave (experts both fused and per expert, or keys with and without 'model.')."
            )
        sd[key] = tensor

    expected = _layout(cfg)[0]
    if cfg.tie_word_embeddings and "embed_tokens.weight" in sd:
        # HF ties lm_head to the embedding (any saved lm_head copy is the same tensor).
        sd["lm_head.weight"] = sd["embed_tokens.weight"]
    missing = set(expected) - set(sd)
    unexpected = set(sd) - set(expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {_name_list(list(missing))}")
        if unexpected:
            parts.append(f"unexpected keys: {_name_list(list(unexpected))}")
        raise ValueError(
            f"checkpoint {str(path)!r} does not match its {cfg.family} config ({'; '.join(parts)})."
        )
    bad = [
        f"{k}: checkpoint {_shape(sd[k])} vs config {expected[k]}"
        for k in sorted(expected)
        if _shape(sd[k]) != expected[k]
    ]
    if bad:
        raise ValueError(
            f"checkpoint {str(path)!r} tensor shapes do not match config.json: "
            + "; ".join(bad[:8])
            + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        )
    return sd

"""gpt-oss's registry entry: its HF config.json, its checkpoint layouts and its rules.

HF's `GptOssForCausalLM` stores each layer's experts as stacked tensors in the x @ W form:
`mlp.experts.gate_up_proj` [E, H, 2I] with gate and up *interleaved* along 2I (gate =
[..., ::2], up = [..., 1::2]), `gate_up_proj_bias` [E, 2I] interleaved alike,
`mlp.experts.down_proj` [E, I, H] and `down_proj_bias` [E, H]. The released checkpoints
store the two matrices as MXFP4 instead (`*_blocks` / `*_scales`, rows = output features,
`zkl.models.mxfp4`), dequantized here exactly. `convert` rewrites either layout into
per-expert separate projections (`experts.<e>.gate_proj.weight` [I, H], ...), which the
model's fused gate/up joins gate-first; the router (`mlp.router`) becomes `mlp.gate`.
"""

from __future__ import annotations

import re

import torch

from zkl.models import mxfp4
from zkl.models.config import ModelConfig, MoEConfig, RopeConfig, check_top_k
from zkl.models.family import Family
from zkl.models.gpt_oss import GptOss
from zkl.models.hf_config import decoder_fields
from zkl.models.transformer import init_weights

_EXPERTS = re.compile(r"^(layers\.\d+\.mlp)\.experts\.(gate_up_proj|down_proj)(_blocks|_scales)?$")
_ROUTER = re.compile(r"^(layers\.\d+\.mlp)\.router\.(weight|bias)$")
QUANT_METHODS = ("mxfp4",)
LAYER_TYPES = ("sliding_attention", "full_attention")  # HF's `layer_types` values


def config_from_hf(hf: dict, base: ModelConfig) -> ModelConfig:
    """The ModelConfig of a `GptOssForCausalLM` config.json (`base` has name/family/checkpoint)."""
    quant = hf.get("quantization_config") or {}
    if quant and quant.get("quant_method") not in QUANT_METHODS:
        raise ValueError(
            f"config.json quantization_config quant_method={quant.get('quant_method')!r} is "
            f"not supported for gpt_oss; zkl reads bf16/fp32 and {list(QUANT_METHODS)}."
        )
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    if rope_type not in ("yarn", "default"):
        raise ValueError(
            f"config.json rope type {rope_type!r} is not supported for gpt_oss (yarn)."
        )
    decoder_fields(hf, base)
    bias = bool(hf.get("attention_bias", True))
    layers = range(base.num_hidden_layers)
    default_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in layers]
    base.rms_norm_eps = float(hf.get("rms_norm_eps", 1e-5))
    # YaRN always: a config.json without scaling is YaRN of factor 1, as gpt-oss computes it
    base.rope = RopeConfig(
        type="yarn",
        theta=float(rope.get("rope_theta", hf.get("rope_theta", 150000.0))),
        factor=float(rope.get("factor") or 1.0) if rope_type == "yarn" else 1.0,
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
        original_max_position_embeddings=int(
            rope.get("original_max_position_embeddings") or base.max_position_embeddings
        ),
        truncate=bool(rope.get("truncate", True)),
    )
    base.qkv_bias = base.o_proj_bias = bias
    base.qk_norm = False
    base.attention_sinks = True
    base.sliding_window = int(hf.get("sliding_window") or 0)
    base.layer_types = list(hf.get("layer_types") or default_types)
    base.moe = MoEConfig(
        num_experts=hf["num_local_experts"],
        num_experts_per_tok=hf["num_experts_per_tok"],
        intermediate_size=base.intermediate_size,
        swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
    )
    return base


def validate(cfg: ModelConfig) -> None:
    """gpt-oss's own rules; ValueError in one sentence naming the key to change."""
    moe = cfg.moe
    if moe.num_experts <= 0:
        raise ValueError(f"model.moe.num_experts must be positive for model.family={cfg.family!r}.")
    check_top_k(cfg)
    if moe.intermediate_size <= 0:
        raise ValueError("model.moe.intermediate_size must be positive for gpt_oss.")
    if len(cfg.layer_types) != cfg.num_hidden_layers or set(cfg.layer_types) - set(LAYER_TYPES):
        raise ValueError(
            f"model.layer_types must name one of {list(LAYER_TYPES)} for each of the "
            f"model.num_hidden_layers={cfg.num_hidden_layers} layers."
        )
    if "sliding_attention" in cfg.layer_types and cfg.sliding_window <= 0:
        raise ValueError("model.sliding_window must be positive for sliding_attention layers.")
    if cfg.rope.type != "yarn":
        raise ValueError(f"model.rope.type={cfg.rope.type!r} must be yarn for gpt_oss.")
    if (
        not cfg.attention_sinks
        or cfg.qk_norm
        or moe.decoder_sparse_step != 1
        or moe.mlp_only_layers
    ):
        raise ValueError(
            "gpt_oss needs model.attention_sinks=true, model.qk_norm=false, "
            "model.moe.decoder_sparse_step=1 and model.moe.mlp_only_layers=[] (every layer is "
            "MoE)."
        )


def _stacked(name: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """An expert matrix in HF's x @ W form [E, in, out], from its bf16 tensor or its MXFP4
    pair (whose rows are the output features: dequantized, then transposed)."""
    blocks, scales = tensors.get(f"{name}_blocks"), tensors.get(f"{name}_scales")
    if blocks is None and scales is None:
        return tensors[name]
    mxfp4.check_pair(name, blocks, scales)
    return mxfp4.dequantize(blocks, scales).transpose(1, 2)


def _expert_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(
            f"checkpoint tensor {name} has shape {list(tensor.shape)}; config.json implies "
            f"{list(shape)}."
        )


def convert(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Names without `model.` -> the same with the router renamed and each layer's stacked
    (or MXFP4) experts split into per-expert projections, gate and up de-interleaved."""
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if router := _ROUTER.match(key):
            prefix, attr = router.groups()
            out[f"{prefix}.gate.{attr}"] = tensor
        elif key.endswith("_bias") and ".mlp.experts." in key:
            prefix = key.split(".experts.")[0]
            stacks.setdefault(prefix, {})[key.rsplit(".", 1)[1]] = tensor
        elif experts := _EXPERTS.match(key):
            prefix, proj, suffix = experts.groups()
            stacks.setdefault(prefix, {})[proj + (suffix or "")] = tensor
        else:
            out[key] = tensor
    e, h, i = cfg.moe.num_experts, cfg.hidden_size, cfg.moe.intermediate_size
    for prefix, parts in stacks.items():
        name = f"{prefix}.experts"
        named = {f"{name}.{k}": v for k, v in parts.items()}
        gate_up = _stacked(f"{name}.gate_up_proj", named)
        down = _stacked(f"{name}.down_proj", named)
        up_bias, down_bias = parts.get("gate_up_proj_bias"), parts.get("down_proj_bias")
        if up_bias is None or down_bias is None:
            raise ValueError(f"checkpoint has no {name}.gate_up_proj_bias / down_proj_bias.")
        _expert_shape(f"{name}.gate_up_proj", gate_up, (e, h, 2 * i))
        _expert_shape(f"{name}.down_proj", down, (e, i, h))
        _expert_shape(f"{name}.gate_up_proj_bias", up_bias, (e, 2 * i))
        _expert_shape(f"{name}.down_proj_bias", down_bias, (e, h))
        for x in range(e):
            out[f"{name}.{x}.gate_proj.weight"] = gate_up[x, :, 0::2].t()
            out[f"{name}.{x}.up_proj.weight"] = gate_up[x, :, 1::2].t()
            out[f"{name}.{x}.gate_proj.bias"] = up_bias[x, 0::2]
            out[f"{name}.{x}.up_proj.bias"] = up_bias[x, 1::2]
            out[f"{name}.{x}.down_proj.weight"] = down[x].t()
            out[f"{name}.{x}.down_proj.bias"] = down_bias[x]
    return out


GPT_OSS = Family(
    name="gpt_oss",
    model_class=GptOss,
    model_types=("gpt_oss",),
    architectures=("GptOssForCausalLM",),
    config_from_hf=config_from_hf,
    validate=validate,
    init_weights=init_weights,
    modules=(
        "zkl/models/gpt_oss_family.py",
        "zkl/models/gpt_oss.py",
        "zkl/models/mxfp4.py",
    ),
    convert=convert,
    capabilities=frozenset({"moe", "sinks", "sliding_window"}),
    sections=frozenset({"rope", "moe"}),
)

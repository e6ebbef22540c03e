"""`model.checkpoint`'s HF weights checked against the model before any model is built,
each fault in one sentence.

Loading finds a bad checkpoint only after the model (possibly billions of parameters) is
allocated, and a `config.json` for another architecture was never compared with the model
config. The files themselves (the path, the JSON files, every safetensors header) are
checked without torch by `zkl.models.hf_weight_files`, before torch loads; here `config.json` is
read by its family and compared with `model.*`, and every tensor name and shape with the
model, through the loader's own mapping.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from zkl.console import say
from zkl.errors import ConfigError
from zkl.models.config import SHAPE_KEYS, ModelConfig, value_at
from zkl.models.hf_checkpoint import map_state_dict, model_config_from_hf
from zkl.models.hf_weight_files import check_weight_dir, headers
from zkl.models.registry import param_count

# config.json must agree with the model config on these (max_position_embeddings may be lower)
ARCH_KEYS = (
    "family",
    *SHAPE_KEYS,
    "rms_norm_eps",
    "qkv_bias",
    "qk_norm",
    "tie_word_embeddings",
    "o_proj_bias",
    "mlp_bias",
    "sliding_window",
    "attention_sinks",
    "layer_types",
    "rope.type",
    "rope.theta",
    "rope.factor",
    "rope.low_freq_factor",
    "rope.high_freq_factor",
    "rope.original_max_position_embeddings",
    "moe.num_experts",
    "moe.num_experts_per_tok",
    "moe.intermediate_size",
    "moe.norm_topk_prob",
    "moe.decoder_sparse_step",
    "moe.mlp_only_layers",
    "moe.swiglu_alpha",
    "moe.swiglu_limit",
)
# The torch dtype of each safetensors dtype zkl reads (`zkl.models.hf_weight_files.DTYPE_BYTES`).
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
REAL_MODEL_PARAMS = 100_000_000  # a model this large without a checkpoint gets a warning


def _meta_tensors(path: Path) -> dict[str, torch.Tensor]:
    return {
        name: torch.empty(shape, dtype=DTYPES[dtype], device="meta")
        for name, (dtype, shape) in headers(path).items()
    }


def hf_model_config(model: ModelConfig) -> ModelConfig:
    """The ModelConfig of `model.checkpoint`'s config.json, or ConfigError naming the key."""
    key = f"model.checkpoint={model.checkpoint}"
    check_weight_dir(model.checkpoint)  # the weights are checked where a run reads them
    try:
        theirs = model_config_from_hf(Path(model.checkpoint), name=model.name)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{key}: config.json is not JSON ({err.msg}, line {err.lineno})."
        ) from None
    except KeyError as err:
        raise ConfigError(f"{key}: config.json has no {err.args[0]!r} entry.") from None
    except (ValueError, TypeError, AttributeError, OSError) as err:
        raise ConfigError(f"{key}: {err}") from None
    return theirs


def check_hf_weights(model: ModelConfig) -> None:
    """Raise ConfigError naming `model.checkpoint` (or the `model.*` key that disagrees)."""
    key = f"model.checkpoint={model.checkpoint}"
    path = Path(model.checkpoint)
    theirs = hf_model_config(model)
    for name in ARCH_KEYS:
        if value_at(model, name) != value_at(theirs, name):
            raise ConfigError(
                f"{key} has {name}={value_at(theirs, name)!r} in its config.json but "
                f"model.{name}={value_at(model, name)!r}; use the model config of the checkpoint."
            )
    try:
        mapped = map_state_dict(_meta_tensors(path), model, path)
    except (ValueError, KeyError, OSError) as err:
        raise ConfigError(f"{key}: {err}") from None
    for name, tensor in sorted(mapped.items()):
        if not tensor.is_floating_point():
            raise ConfigError(f"{key}: tensor {name} is {tensor.dtype}, not a float tensor.")


def warn_random_weights(model: ModelConfig) -> None:
    """A real-sized model without a checkpoint runs on random weights: say so, once."""
    if model.checkpoint or param_count(model) < REAL_MODEL_PARAMS:
        return
    billions = param_count(model) / 1e9
    say(
        f"zkl: warning: model={model.name} has no model.checkpoint, so its {billions:.1f}B "
        "weights are random (seeded init); set model.checkpoint=DIR for real weights."
    )

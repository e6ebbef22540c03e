"""`model.checkpoint` checked before any model is built, each fault in one sentence.

Loading finds a bad checkpoint only after the model (possibly billions of parameters) is
allocated, and a `config.json` for another architecture was never compared with the model
config. Here: the path, `config.json` against `model.*`, every safetensors header (read
without touching the data, so truncation shows as offsets past the end of the file), and
every tensor name and shape against the model, through the loader's own mapping.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from zkl.errors import ConfigError
from zkl.memory import param_count
from zkl.models.config import ModelConfig
from zkl.models.hf_checkpoint import _safetensors_files, map_state_dict, model_config_from_hf

# config.json must agree with the model config on these (max_position_embeddings may be lower)
ARCH_KEYS = (
    "family",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rope_theta",
    "rms_norm_eps",
    "qkv_bias",
    "qk_norm",
    "tie_word_embeddings",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
)
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
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit
REAL_MODEL_PARAMS = 100_000_000  # a model this large without a checkpoint gets a warning


def read_header(file: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) from a safetensors header; ValueError if corrupt or truncated."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{file.name} is not a safetensors file or is truncated (no header).")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            header = None
    if not isinstance(header, dict):
        raise ValueError(f"{file.name} has a corrupt safetensors header.")
    data_bytes = size - 8 - length
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
            nbytes = math.prod(shape) * DTYPES[dtype].itemsize
            consistent = begin >= 0 and end - begin == nbytes and min(shape, default=0) >= 0
        except (TypeError, KeyError, ValueError):
            consistent = False
        if not consistent:
            raise ValueError(f"{file.name} has a corrupt safetensors header entry for {name!r}.")
        if end > data_bytes:
            raise ValueError(
                f"{file.name} is truncated: tensor {name!r} ends at byte {end} of the data, "
                f"the file holds {data_bytes}."
            )
        out[name] = (dtype, shape)
    return out


def _meta_tensors(path: Path) -> dict[str, torch.Tensor]:
    raw: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(path):
        for name, (dtype, shape) in read_header(file).items():
            if name in raw:
                raise ValueError(f"tensor {name!r} appears in more than one safetensors file.")
            raw[name] = torch.empty(shape, dtype=DTYPES[dtype], device="meta")
    return raw


def checkpoint_config(model: ModelConfig) -> ModelConfig:
    """The ModelConfig of `model.checkpoint`'s config.json, or ConfigError naming the key."""
    key = f"model.checkpoint={model.checkpoint}"
    path = Path(model.checkpoint)
    if not path.exists():
        raise ConfigError(f"{key} does not exist.")
    if not path.is_dir():
        raise ConfigError(f"{key} is not a directory with config.json and *.safetensors files.")
    try:
        theirs = model_config_from_hf(path, name=model.name)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{key}: config.json is not JSON ({err.msg}, line {err.lineno})."
        ) from None
    except KeyError as err:
        raise ConfigError(f"{key}: config.json has no {err.args[0]!r} entry.") from None
    except (ValueError, TypeError, AttributeError, OSError) as err:
        raise ConfigError(f"{key}: {err}") from None
    return theirs


def check_checkpoint(model: ModelConfig) -> None:
    """Raise ConfigError naming `model.checkpoint` (or the `model.*` key that disagrees)."""
    key = f"model.checkpoint={model.checkpoint}"
    path = Path(model.checkpoint)
    theirs = checkpoint_config(model)
    for name in ARCH_KEYS:
        if getattr(model, name) != getattr(theirs, name):
            raise ConfigError(
                f"{key} has {name}={getattr(theirs, name)!r} in its config.json but "
                f"model.{name}={getattr(model, name)!r}; use the model config of the checkpoint."
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
    print(
        f"zkl: warning: model={model.name} has no model.checkpoint, so its {billions:.1f}B "
        "weights are random (seeded init); set model.checkpoint=DIR for real weights.",
        file=sys.stderr,
    )

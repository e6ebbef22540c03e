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
import os
import re
import stat
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from zkl.console import say
from zkl.errors import ConfigError
from zkl.memory import param_count
from zkl.models.config import SHAPE_KEYS, ModelConfig
from zkl.models.hf_checkpoint import (
    INDEX_FILE,
    _safetensors_files,
    map_state_dict,
    model_config_from_hf,
)

# config.json must agree with the model config on these (max_position_embeddings may be lower)
ARCH_KEYS = (
    "family",
    *SHAPE_KEYS,
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
    "o_proj_bias",
    "mlp_bias",
    "rope_type",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_position_embeddings",
    "sliding_window",
    "attention_sinks",
    "layer_types",
    "yarn_factor",
    "yarn_original_max_position_embeddings",
    "swiglu_alpha",
    "swiglu_limit",
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
MAX_JSON_BYTES = 64 * 2**20  # config.json and the shard index are a few kB
MAX_JSON_DEPTH = 64  # a safetensors header nests 3 deep, a config.json a handful
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def regular_file(file: Path) -> None:
    """ValueError unless `file` is a regular file: a FIFO or device would block the reader."""
    try:
        mode = os.stat(file).st_mode
    except OSError as err:
        raise ValueError(f"{file.name} cannot be read ({err.strerror or err}).") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{file.name} is not a regular file.")


def nests_deeper(data: bytes, limit: int) -> bool:
    """Whether the JSON text `data` nests arrays/objects more than `limit` deep; no recursion.

    Strings are cut out, the brackets kept; each pass drops the innermost pairs, so more
    than `limit` passes (or more unclosed openers) is deeper than `limit`.
    """
    brackets = _JSON_STRING.sub(b"", data).translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(limit):
        shorter = brackets.replace(b"()", b"")
        if shorter == brackets:
            return brackets.count(b"(") > limit
        brackets = shorter
    return b"(" in brackets


def read_json(file: Path, what: str) -> object:
    """`file` parsed, after the checks that keep the parser from hanging or recursing."""
    regular_file(file)
    if file.stat().st_size > MAX_JSON_BYTES:
        raise ValueError(f"{what} is larger than {MAX_JSON_BYTES >> 20} MiB.")
    data = file.read_bytes()
    if nests_deeper(data, MAX_JSON_DEPTH):
        raise ValueError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels.")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        detail = f"{err.msg}, line {err.lineno}" if isinstance(err, json.JSONDecodeError) else err
        raise ValueError(f"{what} is not JSON ({detail}).") from None


REAL_MODEL_PARAMS = 100_000_000  # a model this large without a checkpoint gets a warning


def read_header(file: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) from a safetensors header; ValueError if corrupt or truncated.

    The safetensors library reads the header (without touching the data) and checks what it
    checks when it loads: every entry well-typed, the tensors' byte ranges in bounds, not
    overlapping and with no gap, covering the data exactly, `__metadata__` a str -> str map.
    Its refusal is then explained by `_explain` (which tensor, which way), before any model
    is built.
    """
    regular_file(file)  # safe_open would block on a FIFO
    try:
        with safe_open(str(file), "pt") as f:
            out = {}
            for name in f.keys():  # noqa: SIM118 (safe_open, not a dict)
                part = f.get_slice(name)
                out[name] = (part.get_dtype(), list(part.get_shape()))
    except SafetensorError as err:
        _explain(file)
        reason = str(err).split(": ", 1)[-1]
        raise ValueError(f"{file.name} has a corrupt safetensors header ({reason}).") from None
    for name, (dtype, _) in out.items():
        # kept: safetensors accepts dtypes (U16, U32, U64, F8_E8M0, F4, ...) that no zkl
        # model holds, and torch cannot make some of them; refused here by name
        if dtype not in DTYPES:
            raise ValueError(f"{file.name} has a corrupt safetensors header entry for {name!r}.")
    return out


def _explain(file: Path) -> None:
    """Raise the ValueError that names what safetensors refused in `file`'s header.

    The library says only which check failed; this reads the header again to say where
    (the tensor, overlap or gap, truncation or extra bytes). Returns when it finds nothing.
    """
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{file.name} is not a safetensors file or is truncated (no header).")
        raw = f.read(length)
    if nests_deeper(raw, MAX_JSON_DEPTH):
        raise ValueError(f"{file.name} has a safetensors header nested too deep.")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict):
        raise ValueError(f"{file.name} has a corrupt safetensors header.")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError(f"{file.name} has a __metadata__ that is not a map of strings.")
    data_bytes = size - 8 - length
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = _entry_range(info)
        if end < 0:
            raise ValueError(f"{file.name} has a corrupt safetensors header entry for {name!r}.")
        if end > data_bytes:
            raise ValueError(
                f"{file.name} is truncated: tensor {name!r} ends at byte {end} of the data, "
                f"the file holds {data_bytes}."
            )
        ranges.append((begin, end, name))
    position, previous = 0, None
    for begin, end, name in sorted(ranges):
        if begin != position:
            where = f"after {previous!r}" if previous else "at the start of the data"
            what = "overlaps the tensor before it" if begin < position else "leaves a gap"
            raise ValueError(
                f"{file.name}: the bytes of tensor {name!r} {what} ({where}, byte {begin} "
                f"instead of {position}); the header's data_offsets are corrupt."
            )
        position, previous = end, name
    if position != data_bytes:
        raise ValueError(
            f"{file.name} holds {data_bytes - position} bytes after its last tensor; the "
            "header's data_offsets are corrupt."
        )


def _entry_range(info: object) -> tuple[int, int]:
    """A header entry's [begin, end) byte range, or (-1, -1) when the entry is malformed:
    offsets not two ints, a shape not of ints, a dtype zkl does not know, or a range whose
    length is not the tensor's size."""
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if not (isinstance(offsets, list) and len(offsets) == 2):
        return -1, -1
    shape = info.get("shape")
    ints = [*offsets, *shape] if isinstance(shape, list) else [None]
    if not all(type(x) is int and x >= 0 for x in ints) or info.get("dtype") not in DTYPES:
        return -1, -1
    begin, end = offsets
    nbytes = math.prod(shape) * DTYPES[info["dtype"]].itemsize
    return (begin, end) if end - begin == nbytes else (-1, -1)


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
        for name, what in (("config.json", "config.json"), (INDEX_FILE, INDEX_FILE)):
            if os.path.lexists(path / name):  # the loader reads them with no such checks
                read_json(path / name, what)
        for file in path.glob("*.safetensors"):
            regular_file(file)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from None
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
    say(
        f"zkl: warning: model={model.name} has no model.checkpoint, so its {billions:.1f}B "
        "weights are random (seeded init); set model.checkpoint=DIR for real weights."
    )

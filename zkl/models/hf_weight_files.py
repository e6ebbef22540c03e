"""`model.checkpoint`'s HF weight files checked without torch: the directory, its JSON
files, every safetensors header.

A missing, truncated or damaged checkpoint is so refused before torch loads
(`zkl.run.checks` runs `check_weight_files` with the command line's other checks).

`read_header` is zkl's one reader of a safetensors header. It holds the header to the rules
the safetensors library checks when it loads a file (strict UTF-8 JSON, every entry
well typed, the tensors' bytes in bounds, in order with no overlap or gap and covering the
data exactly, `__metadata__` a map of strings) and names the tensor and the fault, which the
library's own refusal does not. `zkl.models.hf_weights_check` compares the headers with the
model; the loader (`zkl.models.hf_checkpoint`) reads the shards `safetensors_files` lists
through the library.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from zkl.errors import ConfigError

INDEX_FILE = "model.safetensors.index.json"
# The safetensors dtypes a zkl model can hold, with their bytes per element. Others the
# format allows (U16, U32, U64, F8_E8M0, F4, ...) no zkl model holds and torch cannot make
# some of them: a header naming one is refused by name.
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
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


def read_header(file: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) from a safetensors header; ValueError naming the fault (the
    tensor, overlap or gap, truncation or extra bytes) if it is corrupt or truncated."""
    regular_file(file)  # a FIFO would block the read
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{file.name} is not a safetensors file or is truncated (no header).")
        header = _header_json(f.read(length), file.name)
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise ValueError(f"{file.name} has a __metadata__ that is not a map of strings.")
    data_bytes = size - 8 - length
    ranges = []
    for name, info in header.items():
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
    return {name: (header[name]["dtype"], header[name]["shape"]) for name in sorted(header)}


def _header_json(raw: bytes, file_name: str) -> dict:
    """The header's JSON object, refused where the library's parser refuses it: not UTF-8,
    a key twice in one object, NaN or Infinity."""
    if nests_deeper(raw, MAX_JSON_DEPTH):
        raise ValueError(f"{file_name} has a safetensors header nested too deep.")
    try:
        header = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant
        )
    except ValueError:  # UnicodeDecodeError and JSONDecodeError among them
        header = None
    if not isinstance(header, dict):
        raise ValueError(f"{file_name} has a corrupt safetensors header.")
    return header


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice in one object")
    return dict(pairs)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _entry_range(info: object) -> tuple[int, int]:
    """A header entry's [begin, end) byte range, or (-1, -1) when the entry is malformed:
    offsets not two ints, a shape not of ints, a dtype zkl does not know, or a range whose
    length is not the tensor's size."""
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if not (isinstance(offsets, list) and len(offsets) == 2):
        return -1, -1
    shape = info.get("shape")
    ints = [*offsets, *shape] if isinstance(shape, list) else [None]
    if not all(type(x) is int and x >= 0 for x in ints) or info.get("dtype") not in DTYPE_BYTES:
        return -1, -1
    begin, end = offsets
    elements = 1
    for size in shape:  # the product as the library takes it: no step past 64 bits
        elements *= size
        if elements >= 2**64:
            return -1, -1
    nbytes = elements * DTYPE_BYTES[info["dtype"]]
    return (begin, end) if end - begin == nbytes else (-1, -1)


def safetensors_files(path: Path) -> list[Path]:
    """The shards the index lists (each must be there), else every `*.safetensors` file."""
    index = path / INDEX_FILE
    if os.path.lexists(index):
        weight_map = read_json(index, INDEX_FILE)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise ValueError(f"{INDEX_FILE} has no weight_map of tensor names to shard files.")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise ValueError(f"{INDEX_FILE} lists missing shards {missing}.")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError("the directory has no *.safetensors file.")
    return files


def headers(path: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) of every tensor of the checkpoint at `path`, over its shards."""
    out: dict[str, tuple[str, list[int]]] = {}
    for file in safetensors_files(path):
        for name, entry in read_header(file).items():
            if name in out:
                raise ValueError(f"tensor {name!r} appears in more than one safetensors file.")
            out[name] = entry
    return out


def check_weight_dir(checkpoint: str) -> None:
    """ConfigError naming `model.checkpoint` unless it is a directory with a readable
    config.json, its safetensors files regular files: what reading the model's
    config from it needs, weights or not."""
    key = f"model.checkpoint={checkpoint}"
    path = Path(checkpoint)
    if not path.exists():
        raise ConfigError(f"{key} does not exist.")
    if not path.is_dir():
        raise ConfigError(f"{key} is not a directory with config.json and *.safetensors files.")
    if not os.path.lexists(path / "config.json"):
        raise ConfigError(f"{key} has no config.json.")
    try:
        read_json(path / "config.json", "config.json")
        for file in path.glob("*.safetensors"):
            regular_file(file)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from None


def check_weight_files(checkpoint: str) -> None:
    """`check_weight_dir`, and safetensors files whose headers are whole: what a run from
    the checkpoint needs that can be known without torch."""
    check_weight_dir(checkpoint)
    try:
        headers(Path(checkpoint))
    except ValueError as err:
        raise ConfigError(f"model.checkpoint={checkpoint}: {err}") from None

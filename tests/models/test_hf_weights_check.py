"""A bad `model.checkpoint` is one sentence before any model is built; a good one loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import make_cfg
from tests.test_hostile_input import assert_refused_before_work, run_entry
from zkl.errors import ConfigError
from zkl.models.build import build_model
from zkl.models.hf_export import save_checkpoint
from zkl.models.hf_weight_files import DTYPE_BYTES, INDEX_FILE
from zkl.models.hf_weights_check import DTYPES
from zkl.run.validate import validate


def write_checkpoint(directory: Path, overrides: list[str]) -> None:
    """An HF-format checkpoint of zkl's own seeded model for `overrides` (fp32)."""
    save_checkpoint(build_model(make_cfg(*overrides).model, torch.float32, seed=7), directory)


@pytest.fixture
def good(tmp_path) -> Path:
    directory = tmp_path / "ckpt"
    write_checkpoint(directory, [])
    return directory


def refusal(checkpoint: Path | str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate(make_cfg(f"model.checkpoint={checkpoint}", *overrides))
    message = str(err.value)
    assert message.startswith(f"model.checkpoint={checkpoint}") and "\n" not in message
    return message


def test_the_torch_free_header_reader_knows_the_dtypes_torch_makes():
    """The header reader's byte sizes (no torch) are the torch dtypes' the meta model gets."""
    assert {name: dtype.itemsize for name, dtype in DTYPES.items()} == DTYPE_BYTES


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_a_good_checkpoint_validates_and_loads(tmp_path, model):
    write_checkpoint(tmp_path / model, [f"model={model}"])
    cfg = make_cfg(f"model={model}", f"model.checkpoint={tmp_path / model}")
    validate(cfg)
    loaded = build_model(cfg.model, torch.float32)
    reference = build_model(make_cfg(f"model={model}").model, torch.float32, seed=7)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


def test_path_and_files(tmp_path, good):
    assert "does not exist" in refusal(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    assert "is not a directory" in refusal(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in refusal(tmp_path / "empty")
    (good / "model.safetensors").unlink()
    assert "has no *.safetensors" in refusal(good)


def test_config_json_is_read_and_compared(good):
    config = json.loads((good / "config.json").read_text())
    (good / "config.json").write_text("{not json")
    assert "config.json is not JSON" in refusal(good)
    (good / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "hidden_size"})
    )
    assert "no 'hidden_size' entry" in refusal(good)
    named_only_by_type = {k: v for k, v in config.items() if k != "architectures"}
    (good / "config.json").write_text(json.dumps({**named_only_by_type, "model_type": "gpt2"}))
    assert "model_type='gpt2' is not supported" in refusal(good)
    (good / "config.json").write_text(json.dumps(config))
    message = refusal(good, "model.intermediate_size=96")
    assert "intermediate_size=128 in its config.json but model.intermediate_size=96" in message
    message = refusal(good, "model.tie_word_embeddings=false")
    assert "model.tie_word_embeddings=False" in message


def test_safetensors_headers(good):
    data = (good / "model.safetensors").read_bytes()
    (good / "model.safetensors").write_bytes(data[:-100])
    assert "model.safetensors is truncated: tensor" in refusal(good)
    (good / "model.safetensors").write_bytes(data[:5])
    assert "not a safetensors file or is truncated" in refusal(good)
    length = int.from_bytes(data[:8], "little")
    (good / "model.safetensors").write_bytes(data[:8] + b"\xff" * length + data[8 + length :])
    assert "corrupt safetensors header" in refusal(good)
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] += 4
    raw = json.dumps(header).encode()
    (good / "model.safetensors").write_bytes(
        len(raw).to_bytes(8, "little") + raw + data[8 + length :]
    )
    assert f"corrupt safetensors header entry for '{name}'" in refusal(good)


def test_names_shapes_and_dtypes_against_the_model(tmp_path):
    tensors = {}
    write_checkpoint(tmp_path / "a", [])
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "a" / "model.safetensors")
    cases = {
        "missing keys: layers.1.mlp.up_proj.weight": {
            k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"
        },
        "unexpected keys: extra.weight": {**tensors, "model.extra.weight": torch.zeros(2)},
        "layers.0.mlp.down_proj.weight: checkpoint [64, 96]": {
            **tensors,
            "model.layers.0.mlp.down_proj.weight": torch.zeros(64, 96),
        },
        "tensor norm.weight is torch.int32": {**tensors, "model.norm.weight": torch.ones(64).int()},
    }
    for expected, variant in cases.items():
        save_file(variant, tmp_path / "a" / "model.safetensors")
        assert expected in refusal(tmp_path / "a")


def test_an_index_naming_a_missing_shard(good):
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (good / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "lists missing shards" in refusal(good)


@pytest.mark.parametrize("damage", ["truncated", "gpt2"])
@pytest.mark.slow
def test_the_entry_point_refuses_a_bad_checkpoint_before_building(tmp_path, good, damage):
    if damage == "truncated":
        data = (good / "model.safetensors").read_bytes()
        (good / "model.safetensors").write_bytes(data[: len(data) // 2])
    else:
        config = json.loads((good / "config.json").read_text())
        (good / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    out = run_entry("zkl", [f"model.checkpoint={good}"], tmp_path / "run")
    assert_refused_before_work(out, tmp_path / "run", "model.checkpoint")


def rewrite_header(file: Path, edit, tail: bytes = b"") -> None:
    """`file` with its header edited by `edit(header)` and `tail` appended to the data."""
    data = file.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    edit(header)
    raw = json.dumps(header).encode()
    file.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length :] + tail)


def by_offset(header: dict) -> list[str]:
    names = [k for k in header if k != "__metadata__"]
    return sorted(names, key=lambda k: header[k]["data_offsets"][0])


def shift(header: dict, name: str, delta: int) -> None:
    header[name]["data_offsets"] = [x + delta for x in header[name]["data_offsets"]]


@pytest.mark.parametrize(
    "edit, tail, expected",
    [
        (lambda h: shift(h, by_offset(h)[1], -4), b"", "overlaps the tensor before it"),
        (lambda h: shift(h, by_offset(h)[-1], 4), b"\0" * 4, "leaves a gap"),
        (lambda h: None, b"\0" * 16, "holds 16 bytes after its last tensor"),
        (lambda h: h.update(__metadata__={"format": 1}), b"", "__metadata__ that is not a map"),
        (lambda h: h.update(__metadata__=["pt"]), b"", "__metadata__ that is not a map"),
        (lambda h: h[by_offset(h)[0]].update(data_offsets=[0.0, 4.0]), b"", "corrupt"),
        (lambda h: h[by_offset(h)[0]].update(shape=[True]), b"", "corrupt safetensors header"),
    ],
)
def test_offsets_and_metadata_are_checked_as_safetensors_loads_them(good, edit, tail, expected):
    from safetensors import safe_open

    file = good / "model.safetensors"
    rewrite_header(file, edit, tail)
    assert expected in refusal(good)
    if expected != "corrupt":  # what the loader would have raised after building the model
        with pytest.raises(Exception), safe_open(str(file), "pt") as f:  # noqa: B017
            [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118 (safe_open, not a dict)


def with_raw_header(file: Path, edit) -> None:
    """`file` with the bytes of its header JSON rewritten by `edit(raw)`, the data kept."""
    data = file.read_bytes()
    length = int.from_bytes(data[:8], "little")
    raw = edit(data[8 : 8 + length])
    file.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length :])


def zero_sized(raw: bytes, shape: list[int]) -> bytes:
    """The header with one more tensor of `shape` (no elements) at the end of the data."""
    header = json.loads(raw)
    end = max(info["data_offsets"][1] for k, info in header.items() if k != "__metadata__")
    header["z"] = {"dtype": "F32", "shape": shape, "data_offsets": [end, end]}
    return json.dumps(header).encode()


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda raw: raw.replace(b'"dtype"', b'"dtype": "F32", "dtype"', 1), id="dup"),
        pytest.param(lambda raw: raw.replace(b'"dtype"', b'"x": NaN, "dtype"', 1), id="nan"),
        pytest.param(lambda raw: raw.replace(b'"', b'"\xff', 1), id="not-utf8"),
        pytest.param(lambda raw: zero_sized(raw, [2**40, 2**40, 0]), id="64-bit-overflow"),
    ],
)
def test_the_header_reader_refuses_what_the_library_refuses(good, edit):
    """zkl's one header reader accepts no header the loader's safetensors would refuse after
    the model is built."""
    from safetensors import safe_open

    file = good / "model.safetensors"
    with_raw_header(file, edit)
    assert "corrupt safetensors header" in refusal(good)
    with pytest.raises(Exception), safe_open(str(file), "pt") as f:  # noqa: B017
        [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118 (safe_open, not a dict)


def test_the_header_reader_accepts_what_the_library_accepts(good):
    """A null `__metadata__` and spaces around the JSON (writers pad with them) are a good
    header."""
    from safetensors import safe_open

    def null_metadata(raw: bytes) -> bytes:
        return b" " + json.dumps({**json.loads(raw), "__metadata__": None}).encode() + b"   "

    with_raw_header(good / "model.safetensors", null_metadata)
    validate(make_cfg(f"model.checkpoint={good}"))
    with safe_open(str(good / "model.safetensors"), "pt") as f:
        assert f.metadata() is None


DEEP = 200_000


def test_deep_nesting_is_refused_without_recursion(good):
    deep = b"[" * DEEP + b"]" * DEEP
    with pytest.raises(RecursionError):  # what the plain parser does with such a file
        json.loads(b'{"a": ' + deep + b"}")
    config = (good / "config.json").read_bytes()
    (good / "config.json").write_bytes(b'{"a": ' + deep + b", " + config[1:])
    assert "config.json nests deeper than 64 levels" in refusal(good)
    (good / "config.json").write_bytes(config)
    file = good / "model.safetensors"
    data = file.read_bytes()
    length = int.from_bytes(data[:8], "little")
    raw = b'{"__metadata__": ' + deep + b", " + data[9 : 8 + length]
    file.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length :])
    assert "header nested too deep" in refusal(good)
    (good / "config.json").write_text('{"s": "[[[[' + "[" * 100 + '", "model_type": 1}')
    assert "nests deeper" not in refusal(good)  # brackets inside a string do not nest


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", INDEX_FILE])
def test_a_fifo_is_refused_without_blocking(good, name):
    import os
    import signal

    (good / name).unlink(missing_ok=True)
    os.mkfifo(good / name)
    signal.alarm(60)  # a reader blocked on the FIFO fails the test instead of hanging it
    try:
        assert f"{name} is not a regular file" in refusal(good)
    finally:
        signal.alarm(0)


def test_the_entry_point_refuses_overlapping_offsets_before_building(tmp_path, good):
    rewrite_header(good / "model.safetensors", lambda h: shift(h, by_offset(h)[1], -4))
    out = run_entry("zkl", [f"model.checkpoint={good}"], tmp_path / "run")
    assert_refused_before_work(out, tmp_path / "run", "model.checkpoint")
    assert "overlaps the tensor before it" in out.stderr

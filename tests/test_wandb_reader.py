"""Round-trip a real wandb offline run through zkl.tracking.wandb_reader."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest

from zkl.tracking import wandb_reader as wr

CONFIG = {"lr": 1e-7, "model": {"layers": 2, "name": "tiny"}, "seeds": [1, 2, 3], "flag": True}
GROUP = "zkl-group"
TAGS = ["reader", "offline"]
BIG_TEXT = "0123456789abcdef" * 5000  # 80 kB: forces FIRST/MIDDLE/LAST chunks in the log

ROWS = [
    {"train/gen_kl_error": 0.0, "train/loss": 1e-7, "eval/x": 0.1 + 0.2, "count": 0},
    {"train/gen_kl_error": 0.0, "train/loss": 1 / 3, "eval/x": 5e-324, "count": 1},
    {"train/gen_kl_error": 0.0, "train/loss": -2.5e-300, "eval/x": 1.7976931348623157e308},
    {"train/gen_kl_error": 0.0, "train/loss": 2.0, "text": BIG_TEXT, "nested": {"a": 0.1}},
    {"train/gen_kl_error": 0.0, "train/loss": math.inf, "eval/x": -0.1, "count": 2**62 + 1},
]

# Run in a child process: wandb.init spawns a wandb-core service, and a child with a timeout
# can neither hang the test session nor leave that service running in it.
SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import wandb

    out_dir, spec_path = sys.argv[1], sys.argv[2]
    spec = json.load(open(spec_path))
    t0 = time.perf_counter()
    run = wandb.init(
        mode="offline", dir=out_dir, project="zkl-test",
        config=spec["config"], group=spec["group"], tags=spec["tags"],
    )
    t1 = time.perf_counter()
    for row in spec["rows"]:
        run.log(row)
    run.summary["best"] = 0.5
    t2 = time.perf_counter()
    run.finish()
    t3 = time.perf_counter()
    json.dump({"init_s": t1 - t0, "finish_s": t3 - t2}, open(spec_path + ".timing", "w"))
    """
)


def _offline_env(tmp: Path, encoding: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
        WANDB_CONSOLE="off",
        WANDB_X_DISABLE_STATS="true",
        WANDB_X_DISABLE_MACHINE_INFO="true",
        WANDB_INIT_TIMEOUT="60",
        WANDB_CONFIG_DIR=str(tmp / "config"),
        WANDB_CACHE_DIR=str(tmp / "cache"),
        WANDB_DATA_DIR=str(tmp / "data"),
        WANDB_ARTIFACT_DIR=str(tmp / "artifacts"),
        WANDB_X_HISTORY_VALUE_ENCODING=encoding,
    )
    return env


@pytest.fixture(scope="module", params=["json", "json,typed"])
def offline_run(request, tmp_path_factory) -> tuple[Path, str]:
    """A finished offline run (default JSON value encoding, and JSON + typed)."""
    encoding = request.param
    tmp = tmp_path_factory.mktemp("wandb_run")
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"config": CONFIG, "group": GROUP, "tags": TAGS, "rows": ROWS}))
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp), str(spec)],
        check=False,
        env=_offline_env(tmp, encoding),
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    timing = json.loads(Path(str(spec) + ".timing").read_text())
    print(f"wandb offline ({encoding}): {timing}, subprocess {time.perf_counter() - start:.2f}s")
    return tmp, encoding


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def test_history_round_trips_exactly(offline_run):
    tmp, encoding = offline_run
    history = wr.read_history(tmp)
    assert [row["_step"] for row in history] == list(range(len(ROWS)))
    for step, (logged, row) in enumerate(zip(ROWS, history, strict=True)):
        assert {"_runtime", "_timestamp", "_step"} <= row.keys()
        user = {k: v for k, v in row.items() if not k.startswith("_")}
        assert user.keys() == logged.keys(), step
        for key, value in logged.items():
            assert _same(user[key], value), (step, key, user[key], value)
            if encoding == "json,typed":  # the typed form keeps float vs int
                assert type(user[key]) is type(value), (step, key)
    assert history[0]["train/gen_kl_error"] == 0.0
    assert history[0]["eval/x"] == 0.30000000000000004
    assert history[0]["train/loss"] == 1e-7
    assert history[3]["text"] == BIG_TEXT


def test_config_summary_and_run_info(offline_run):
    tmp, _ = offline_run
    assert wr.read_config(tmp) == CONFIG
    assert "_wandb" in wr.read_config(tmp, include_internal=True)
    summary = wr.read_summary(tmp)
    assert summary["best"] == 0.5
    assert summary["train/loss"] == math.inf
    assert summary["_step"] == len(ROWS) - 1
    info = wr.read_run_info(tmp)
    assert info["project"] == "zkl-test"
    assert info["group"] == GROUP
    assert info["tags"] == TAGS
    assert info["exit_code"] == 0
    assert info["id"] and info["start_time"] > 0


def test_records_and_find(offline_run):
    tmp, _ = offline_run
    path = wr.find_offline_run_file(tmp)
    assert path.suffix == ".wandb" and path.parent.name.startswith("offline-run-")
    assert wr.find_offline_run_file(tmp / "wandb") == path
    assert wr.find_offline_run_file(path.parent) == path
    assert wr.find_offline_run_file(path) == path
    assert path.read_bytes()[:7] == b":W&B\xe1\xbe\x00"
    kinds = [r.WhichOneof("record_type") for r in wr.read_records(path)]
    assert kinds[0] == "header" and kinds[-1] == "exit"
    assert kinds.count("history") == len(ROWS)


def test_find_errors(offline_run, tmp_path):
    with pytest.raises(ValueError, match="no offline-run"):
        wr.find_offline_run_file(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        wr.find_offline_run_file(tmp_path / "missing")
    src = wr.find_offline_run_file(offline_run[0]).parent
    for name in ("offline-run-1-a", "offline-run-2-b"):
        shutil.copytree(src, tmp_path / "wandb" / name)
    with pytest.raises(ValueError, match="2 offline runs"):
        wr.find_offline_run_file(tmp_path)


def test_truncated_file_raises(offline_run, tmp_path):
    data = wr.find_offline_run_file(offline_run[0]).read_bytes()
    bad = tmp_path / "run-trunc.wandb"
    # Cut inside a record (mid-payload of the big fragmented history record as well).
    for cut in (len(data) - 5, 40_000):
        bad.write_bytes(data[:cut])
        with pytest.raises(wr.TruncatedLogError):  # a ValueError
            wr.read_history(bad)
    bad.write_bytes(data[:3])
    with pytest.raises(ValueError, match="header"):
        wr.read_history(bad, allow_truncated=True)
    bad.write_bytes(data[:-5])
    assert len(wr.read_history(bad, allow_truncated=True)) == len(ROWS)
    bad.write_bytes(b"")
    with pytest.raises(ValueError, match="header"):
        list(wr.read_records(bad))


def test_corrupted_file_raises(offline_run, tmp_path):
    data = bytearray(wr.find_offline_run_file(offline_run[0]).read_bytes())
    bad = tmp_path / "run-bad.wandb"
    flipped = bytearray(data)
    flipped[100] ^= 0x01  # inside the second record's payload
    bad.write_bytes(flipped)
    with pytest.raises(ValueError, match="checksum"):
        wr.read_history(bad)
    with pytest.raises(ValueError, match="checksum"):  # truncation tolerance is not a pass
        wr.read_history(bad, allow_truncated=True)
    bad.write_bytes(b"XW&B" + data[4:])
    with pytest.raises(ValueError, match="not a W&B"):
        list(wr.read_records(bad))


def _write_log(path: Path, payloads: list[bytes]) -> None:
    """Independent writer of the format (LevelDB log, W&B header, CRC-32 of type + data)."""
    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))
    for payload in payloads:
        rest, first = payload, True
        while True:
            left = wr.BLOCK_SIZE - len(out) % wr.BLOCK_SIZE
            if left < 7:
                out += b"\0" * left
                left = wr.BLOCK_SIZE
            piece, rest = rest[: left - 7], rest[left - 7 :]
            last = not rest
            kind = (1 if last else 2) if first else (4 if last else 3)
            crc = zlib.crc32(piece, zlib.crc32(bytes([kind])))
            out += struct.pack("<IHB", crc, len(piece), kind) + piece
            first = False
            if last:
                break
    path.write_bytes(bytes(out))


def _history_record(step: int, text_len: int):
    from wandb.proto import wandb_internal_pb2 as pb

    record = pb.Record()
    record.history.step.num = step
    item = record.history.item.add()
    item.nested_key.append("train/loss")
    item.value_json = json.dumps(step / 7)
    text = record.history.item.add()
    text.key = "t"
    text.value_json = json.dumps("x" * text_len)
    return record


def _sized_history_record(step: int, size: int) -> tuple[bytes, int]:
    """A serialized history record of exactly ``size`` bytes, and its text length."""
    for text_len in range(size - 60, size):
        payload = _history_record(step, text_len).SerializeToString()
        if len(payload) == size:
            return payload, text_len
    raise AssertionError(size)


def test_synthetic_log_with_padding_and_fragments(tmp_path):
    block = wr.BLOCK_SIZE
    # 1st record ends 3 bytes before the block end (zero padding follows); the 2nd ends
    # exactly 7 bytes before the next block end (the 3rd starts with an empty FIRST chunk).
    exact_sizes = [block - 7 - 7 - 3, block - 7 - 7]
    text_lens = [5, 100_000] + [s * 997 for s in range(20)]
    payloads, expected = [], []
    for step in range(len(exact_sizes) + len(text_lens)):
        if step < len(exact_sizes):
            payload, text_len = _sized_history_record(step, exact_sizes[step])
        else:
            text_len = text_lens[step - len(exact_sizes)]
            payload = _history_record(step, text_len).SerializeToString()
        payloads.append(payload)
        expected.append({"train/loss": step / 7, "t": "x" * text_len, "_step": step})
    path = tmp_path / "run-synthetic.wandb"
    _write_log(path, payloads)
    data = path.read_bytes()
    assert data[block - 3 : block] == b"\0\0\0"  # padding was exercised
    assert data[2 * block - 7 + 4 : 2 * block - 7 + 7] == b"\0\0\2"  # empty FIRST chunk
    assert wr.read_history(path) == expected
    assert [r.history.step.num for r in wr.read_records(path)] == list(range(len(payloads)))

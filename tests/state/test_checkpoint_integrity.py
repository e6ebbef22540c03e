"""checkpoint.pt cannot lie: damage of any kind is one sentence before a resume uses it, and a
save that fails leaves the previous checkpoint, every metric and no temporary file."""

from __future__ import annotations

import errno
import os
import random
import resource
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.conftest import make_cfg
from zkl.errors import ConfigError, RunFault
from zkl.rl.loop import run
from zkl.state import checkpoint_file
from zkl.state.config import CHECKPOINT_FILE

REPO = Path(__file__).resolve().parents[2]
TINY = ["rl.prompts_per_step=2", "rl.samples_per_prompt=2", "tracking.dump_tokens=all"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A 2-step run with its checkpoint at step 2."""
    run_dir = tmp_path_factory.mktemp("saved")
    run(make_cfg("rl.steps=2", *TINY), run_dir)
    return run_dir


@pytest.fixture
def copy(saved, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    return run_dir


def refused(run_dir: Path, *fragments: str) -> str:
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError) as err:
        run(make_cfg("rl.steps=3", "resume=true", *TINY), run_dir)
    message = str(err.value)
    path = run_dir / CHECKPOINT_FILE
    assert message.startswith(f"{path} ") and "\n" not in message
    assert message.endswith(
        "delete it to rerun from step 0 with resume=true, or start afresh without resume=true "
        "in another hydra.run.dir."
    )
    for fragment in fragments:
        assert fragment in message, message
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing logged is lost
    return message


def largest_entry_offset(path: Path) -> tuple[int, int]:
    """(offset, size) of the largest stored (tensor) entry's bytes in torch's zip file."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def test_flipped_bits_in_a_tensor_are_refused(copy):
    path = copy / CHECKPOINT_FILE
    offset, size = largest_entry_offset(path)
    data = bytearray(path.read_bytes())
    data[offset + size // 2] ^= 0x10
    path.write_bytes(bytes(data))
    torch.load(path, weights_only=True)  # torch itself loads the damaged file silently
    refused(copy, "does not match its digest")


@pytest.mark.parametrize("damage", ["truncated", "empty", "random"])
def test_unreadable_checkpoints_are_one_sentence(copy, damage):
    path = copy / CHECKPOINT_FILE
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
        refused(copy, "cannot be read as a checkpoint")
    elif damage == "empty":
        path.write_bytes(b"")
        refused(copy, "is empty")
    else:
        path.write_bytes(random.Random(0).randbytes(4096))
        refused(copy, "cannot be read as a checkpoint")


def test_a_fifo_is_refused_without_blocking(copy):
    path = copy / CHECKPOINT_FILE
    path.unlink()
    os.mkfifo(path)
    refused(copy, "is not a regular file")


def rewrite(path: Path, edit) -> None:
    """`edit` the state and store it with a matching digest: a writer that saved nonsense."""
    state = torch.load(path, weights_only=True)
    edit(state)
    state[checkpoint_file.DIGEST_KEY] = checkpoint_file.digest(state)
    torch.save(state, path)


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda s: s.update(step=-5), "has step -5, not a step a run saves after"),
        (lambda s: s.update(step=10**12), f"has step {10**12}, beyond rl.steps=3"),
        (lambda s: s.update(step="2"), "its 'step' is a str, not int"),
        (lambda s: s.update(step=True), "its 'step' is a bool, not int"),
        (lambda s: s.pop("wandb_id"), "it has no 'wandb_id' field"),
        (lambda s: s["policy"].update(version=7), "has weight version 7, not its step 2"),
        (lambda s: s["policy"].update(version=-1), "has weight version -1, not its step 2"),
        (lambda s: s["rng"].update(torch=[1, 2]), "its rng.'torch' is a list, not Tensor"),
        (lambda s: s.update(format=1), "has checkpoint format 1, not 2"),
    ],
)
def test_out_of_range_missing_or_mistyped_fields_are_refused(copy, edit, fragment):
    rewrite(copy / CHECKPOINT_FILE, edit)
    refused(copy, fragment)


def test_an_edited_value_without_its_digest_is_refused(copy):
    path = copy / CHECKPOINT_FILE
    state = torch.load(path, weights_only=True)
    state["step"] = 1  # in range, but not what was saved
    torch.save(state, path)
    refused(copy, "does not match its digest")


def test_a_failed_save_keeps_the_previous_checkpoint_and_every_metric(copy, monkeypatch):
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"x" * 1000)  # part of the file went out before the disk filled
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_file.torch, "save", full_disk)
    with pytest.raises(RunFault) as err:
        run(make_cfg("rl.steps=3", "resume=true", *TINY), copy)
    path = copy / CHECKPOINT_FILE
    assert str(err.value) == (
        f"cannot save {path} (No space left on device); the previous checkpoint.pt is kept, "
        "with every logged step; free space on that disk and rerun with resume=true."
    )
    assert not path.with_name(path.name + ".tmp").exists()
    assert checkpoint_file.read(path, 3)["step"] == 2  # intact and verified
    assert len((copy / "metrics.jsonl").read_text().splitlines()) == 3
    monkeypatch.setattr(checkpoint_file.torch, "save", real_save)
    rows = run(make_cfg("rl.steps=3", "resume=true", *TINY), copy)  # the way out works
    assert [r["step"] for r in rows] == [0, 1, 2]


@pytest.mark.slow
def test_a_full_disk_during_a_save_is_one_sentence_and_exit_1(copy):
    """A real write failure: files may grow to 256 kB, less than the checkpoint needs."""
    path = copy / CHECKPOINT_FILE
    assert path.stat().st_size > 256_000

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256_000, 256_000))

    cmd = [sys.executable, "-m", "zkl", f"hydra.run.dir={copy}", "resume=true", "rl.steps=3"]
    cmd += ["tracking.wandb.mode=disabled", "tracking.progress=false", *TINY]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=limit)
    lines = [x for x in out.stderr.splitlines() if x.strip() and "resuming" not in x]
    assert out.returncode == 1, out.stderr
    assert len(lines) == 1 and lines[0].startswith(f"zkl: cannot save {path} ("), out.stderr
    assert "Traceback" not in out.stderr
    assert not path.with_name(path.name + ".tmp").exists()
    assert checkpoint_file.read(path, 3)["step"] == 2
    assert len((copy / "metrics.jsonl").read_text().splitlines()) == 3


def test_the_digest_is_the_one_earlier_checkpoints_hold():
    """The digest reads each tensor's bytes through a uint8 view: the same sha256 as the
    raw-memory read it replaced (this hex was computed by that code), so older checkpoints
    still verify; a transposed bf16, a bool, an empty and a 0-d tensor cover the layouts."""
    weights = torch.arange(12, dtype=torch.float32).reshape(3, 4).t().bfloat16()
    state = {
        "w": weights,
        "b": torch.tensor([True, False]),
        "e": torch.zeros(0),
        "s": torch.tensor(2.5, dtype=torch.float64),
        "n": [1, 2.5, "x", None, (b"y",)],
    }
    expected = "393e404b7aad5ba174e581b32234a7896c69b8844d6a5216c047f6a265bbf8ca"
    assert checkpoint_file.digest(state) == expected
    state["w"] = weights.clone().view(torch.int16).add_(1).view(torch.bfloat16)
    assert checkpoint_file.digest(state) != expected

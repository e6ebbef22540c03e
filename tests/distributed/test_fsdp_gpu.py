"""FSDP2 on CUDA (NCCL): world size 1 through the FSDP path on one GPU, and world sizes 2-8
on several GPUs of one host (`python -m pytest -m gpu tests/distributed/test_fsdp_gpu.py`, or stage
`multi` of scripts/gpu_fsdp.sh). Each test skips below the GPU count it needs."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from tests.distributed.test_distributed import _ranks, _steady, _tokens
from tests.test_faults import finish, start, wait_for_step
from zkl.rl.loop import run
from zkl.tracking.run_log import read_metrics

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off on these machines
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.gpu


def needs(count: int):
    return pytest.mark.skipif(count > GPUS, reason=f"needs {count} GPUs, this host has {GPUS}")


def _zero_and_trained(rows: list[dict]) -> None:
    for r in rows:
        assert r["train/max_abs_logprob_diff"] == 0.0, r
        assert r["weights/changed_tensors"] > 0, r


@needs(1)
@pytest.mark.parametrize("offload", [False, True])
def test_world_size_1_through_fsdp_is_zero(tmp_path, offload):
    """trainer.fsdp=true on one GPU (a one-rank NCCL group), with and without host offload."""
    rows = run(make_cfg("device=cuda", "trainer.fsdp=true", f"trainer.offload={offload}",
                        "rl.steps=3", *SMALL), tmp_path)  # fmt: skip
    _zero_and_trained(rows)


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
def test_world_sizes_zero_and_step0_equal_world_size_1(tmp_path, world_size, model, precision):
    if world_size > GPUS:
        pytest.skip(f"needs {world_size} GPUs, this host has {GPUS}")
    common = ["device=cuda", f"model={model}", f"+precision={precision}", "kv=persist"]
    common += ["rl.prompts_per_step=8", "rl.samples_per_prompt=4", "tracking.dump_tokens=all"]
    rows = run(make_cfg(*common, "rl.steps=3", f"trainer.world_size={world_size}"), tmp_path / "n")
    _zero_and_trained(rows)
    (one,) = run(make_cfg(*common, "rl.steps=1"), tmp_path / "1")
    assert _steady(rows[0]) == _steady(one)
    assert _tokens(tmp_path / "n", 0) == _tokens(tmp_path / "1", 0)


@needs(2)
def test_default_mode_is_not_zero_at_world_size_2(tmp_path):
    rows = run(make_cfg("device=cuda", "trainer.world_size=2", "rl.steps=2", *SMALL,
                        "zero_train_gen_mismatch=false"), tmp_path)  # fmt: skip
    assert all(r["train/max_abs_logprob_diff"] > 0.0 for r in rows)


@needs(2)
def test_rank_killed_is_reported_without_an_nccl_hang(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["device=cuda", "trainer.world_size=2", "rl.steps=500"], run_dir)
    pids = _ranks(proc.pid, 2)
    wait_for_step(proc, run_dir)
    os.kill(pids[1], signal.SIGKILL)
    lines, seconds = finish(proc, time.monotonic())
    assert proc.returncode == 1 and seconds < 30, (seconds, lines)
    assert any(x.startswith("zkl: rank 0 of 2: rank 1 stopped answering") for x in lines), lines
    assert len(read_metrics(run_dir)) >= 1

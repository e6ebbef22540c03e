"""The dedicated generator on a GPU of its own (`layout.transport=nccl`), on two GPUs of one
host (nvidia-h200-x2: `python -m pytest -m gpu tests/layouts/test_multi_gpu.py`). Skipped with
fewer than two CUDA devices."""

from __future__ import annotations

import math
import os
import signal
import time

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from tests.test_faults import finish, generation_child, start, wait_for_step
from zkl.lab.transport_peak import peak_gb_per_s
from zkl.layouts.dedicated import DedicatedGenerator
from zkl.rl.loop import run
from zkl.tracking.run_log import read_metrics
from zkl.trainer.build import build_policy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
    ),
]
NCCL = ["+layout=dedicated", "layout.transport=nccl", "device=cuda:0"]


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_nccl_generator_equals_colocated_bitwise(tmp_path, model):
    """Same seed, same rollouts, same updates: the layout changes no bit of any metric."""
    common = [f"model={model}", "rl.steps=3", "kv=persist", *SMALL]
    colocated = run(make_cfg(*common, "device=cuda:0"), tmp_path / "c")
    dedicated = run(make_cfg(*common, *NCCL), tmp_path / "d")
    keys = [k for k in colocated[0] if k.startswith(("train/", "reward/", "optim/"))]
    for a, b in zip(colocated, dedicated, strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
        assert b["train/max_abs_logprob_diff"] == 0.0 and b["optim/update_norm"] > 0


def test_nccl_default_mode_is_not_zero(tmp_path):
    rows = run(make_cfg("rl.steps=2", *SMALL, *NCCL, "zero_train_gen_mismatch=false"), tmp_path)
    assert all(r["train/max_abs_logprob_diff"] > 0.0 for r in rows)


def test_nccl_generator_killed_mid_run_is_reported_in_seconds(tmp_path):
    """No NCCL hang: the trainer watches the child and aborts the communicator."""
    run_dir = tmp_path / "run"
    proc = start([*NCCL, "rl.steps=500"], run_dir)
    wait_for_step(proc, run_dir)
    os.kill(generation_child(proc.pid), signal.SIGKILL)
    lines, seconds = finish(proc, time.monotonic())
    assert proc.returncode == 1 and seconds < 15, (seconds, lines)
    assert lines[-1].startswith("zkl: the generation process was killed by signal SIGKILL")
    assert len(read_metrics(run_dir)) >= 1


def test_nccl_peak_and_refit_on_two_gpus(tmp_path):
    cfg = make_cfg(*NCCL)
    policy = build_policy(cfg)
    rate = peak_gb_per_s(cfg, 64 << 20, repeats=3)
    assert math.isfinite(rate) and rate > 0
    generator = DedicatedGenerator(cfg, eos_id=1, run_dir=tmp_path)
    try:
        assert generator.transport == "nccl"
        generator.refit(policy.refit_state(), policy.version)
    finally:
        generator.close()

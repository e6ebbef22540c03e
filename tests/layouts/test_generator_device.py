"""The dedicated generator's placement (`layout.transport=nccl`: a GPU of its own) and the
transport's peak bandwidth a refit is compared against, checked on the CPU.

The two-GPU runs themselves are in tests/layouts/test_multi_gpu.py (nvidia-h200-x2); here a fake
two-GPU machine checks every sentence a placement that cannot run gets, before any work.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from tests.conftest import fake_gpus, make_cfg
from zkl import memory
from zkl.device import generator_device
from zkl.errors import ConfigError
from zkl.lab.transport_peak import peak_gb_per_s
from zkl.layouts.dedicated import DedicatedGenerator
from zkl.run.validate import validate
from zkl.trainer.build import build_policy

HUGE = 10**15
NCCL = ["+layout=dedicated", "layout.transport=nccl"]


@pytest.fixture
def two_gpus(monkeypatch):
    """torch.cuda reporting two idle devices (nothing here touches a real one)."""
    fake_gpus(monkeypatch, 2)


def one_sentence(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate(make_cfg(*overrides))
    message = str(err.value)
    assert "\n" not in message and message.count(". ") == 0, message
    return message


def test_nccl_needs_two_gpus_on_this_cpu_machine():
    message = one_sentence(*NCCL)
    assert message.startswith("layout.transport=nccl puts the generator on a GPU of its own")
    assert "this machine has 0" in message and message.endswith("use layout.transport=auto.")


def test_the_generator_defaults_to_the_gpu_after_the_trainers(two_gpus):
    assert generator_device(make_cfg("device=cuda:0", *NCCL)) == torch.device("cuda", 1)
    assert generator_device(make_cfg("device=cuda:1", *NCCL)) == torch.device("cuda", 0)
    named = make_cfg("device=cuda:1", *NCCL, "layout.generator_device=cuda:0")
    assert generator_device(named) == torch.device("cuda", 0)
    shared = make_cfg("device=cuda:0", "+layout=dedicated")  # cuda_ipc: the trainer's GPU
    assert generator_device(shared) == torch.device("cuda", 0)
    assert generator_device(make_cfg("+layout=dedicated")) == torch.device("cpu")


@pytest.mark.parametrize(
    ("overrides", "start"),
    [
        (["layout.generator_device=cuda:0"], "layout.generator_device='cuda:0' is the trainer's"),
        (["layout.generator_device=cuda:2"], "layout.generator_device='cuda:2' must be cuda:N"),
        (["layout.generator_device=cpu"], "layout.generator_device='cpu' must be cuda:N"),
        (["layout.generator_device=gpu1"], "layout.generator_device='gpu1' must be cpu, cuda:N"),
        (["layout.name=colocated"], "layout.transport=nccl is for +layout=dedicated"),
    ],
)
def test_a_placement_that_cannot_run_is_one_sentence(two_gpus, overrides, start):
    assert one_sentence("device=cuda:0", *NCCL, *overrides).startswith(start)


def test_generator_device_without_nccl_is_refused(two_gpus):
    message = one_sentence("device=cuda:0", "+layout=dedicated", "layout.generator_device=cuda:1")
    assert message.startswith("layout.generator_device='cuda:1' needs layout.transport=nccl")
    validate(make_cfg("device=cuda:0", "+layout=dedicated", "layout.generator_device=cuda:0"))


def test_the_generators_gpu_is_checked_for_its_own_memory(two_gpus, monkeypatch):
    """Trainer and generator are each checked against their own GPU's free memory."""
    free = {0: HUGE, 1: 2 * 10**9}
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda d: (free[torch.device(d).index or 0], HUGE)
    )
    monkeypatch.setattr(memory, "available_bytes", lambda: HUGE)
    big = ["model=qwen2_5_1_5b", "device=cuda:0", *NCCL]
    message = one_sentence(*big)
    assert "the generator's GPU (cuda:1) has 2.0 GB free" in message
    assert message.endswith("(layout.generator_device).")
    free[1] = HUGE
    validate(make_cfg(*big))
    # The generator's parts leave the trainer's GPU: its estimate is smaller than cuda_ipc's.
    cfg, shared = (
        make_cfg(*big),
        make_cfg("model=qwen2_5_1_5b", "device=cuda:0", "+layout=dedicated"),
    )
    own = sum(memory.estimate(cfg, 512).values())
    assert own < sum(memory.estimate(shared, 512).values())
    assert memory.generator_estimate(shared, 512) == {}
    assert memory.generator_estimate(cfg, 512)["generator weights and refit buffer"] > 0


@pytest.mark.slow
def test_peak_measures_the_broadcast_the_refit_uses(tmp_path):
    """gloo on the CPU: a finite positive GB/s, and a generator refits afterwards (the peak
    leaves no group behind)."""
    cfg = make_cfg("+layout=dedicated", "model.num_hidden_layers=1")
    rate = peak_gb_per_s(cfg, 1 << 20, repeats=3)
    assert math.isfinite(rate) and rate > 0
    assert not dist.is_initialized()
    generator = DedicatedGenerator(cfg, eos_id=1, run_dir=tmp_path)
    try:
        policy = build_policy(cfg)
        generator.refit(policy.refit_state(), policy.version)
    finally:
        generator.close()

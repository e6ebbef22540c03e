"""The CPU threads a run computes on (zkl/threads.py): one on a CPU run unless `num_threads`
says otherwise, torch's default on CUDA."""

from __future__ import annotations

import torch

from tests.conftest import SMALL, fake_gpus, make_cfg
from zkl.rl.loop import run
from zkl.threads import run_threads


def test_the_rule_one_thread_on_cpu_unless_num_threads_says(monkeypatch):
    assert run_threads(0, "cpu") == 1
    assert run_threads(0, "auto") == 1  # no GPU here: auto is the CPU
    assert run_threads(3, "cpu") == 3
    fake_gpus(monkeypatch, 1)
    assert run_threads(0, "cuda") is None  # torch's default
    assert run_threads(0, "auto") is None
    assert run_threads(4, "cuda:0") == 4


def test_a_default_cpu_run_computes_on_one_thread(tmp_path):
    torch.set_num_threads(2)  # what torch gives a 2-core machine (conftest restores it)
    run(make_cfg(*SMALL, "rl.steps=1"), tmp_path)
    assert torch.get_num_threads() == 1

"""The RL-shaped bench's logic on the CPU at a tiny shape (its figures come from the H200)."""

from __future__ import annotations

import pytest
import torch

from zkl.errors import ConfigError
from zkl.lab import bench_rl
from zkl.lab.config import BenchConfig, check_bench
from zkl.lab.schema import BenchRunConfig
from zkl.run.compose import compose


def test_shapes_parse_and_bad_ones_are_one_sentence():
    assert bench_rl.parse_shape("4096x1024x64") == (4096, 1024, 64)
    for bad in ("4096x1024", "ax1x8", "16x4x8", "64x4x9"):
        with pytest.raises(ConfigError, match="bench.gen_shapes"):
            check_bench(BenchConfig(workload="rl", gen_shapes=[bad]), on_cuda=True)
    with pytest.raises(ConfigError, match="device=cuda"):
        check_bench(BenchConfig(workload="rl"), on_cuda=False)
    with pytest.raises(ConfigError, match="bench.workload"):
        check_bench(BenchConfig(workload="long"), on_cuda=True)


@pytest.mark.slow
def test_rl_rows_time_both_modes_from_the_same_weights():
    cfg = compose(
        ["tracking.wandb.mode=disabled", "bench.gen_shapes=[40x6x8]", "bench.step_shapes=[40x6x8]"],
        schema=BenchRunConfig,
    )
    out = bench_rl.run_rl_bench(cfg, lambda partial: None, bandwidth=1e10)
    step = "rl_step/40x6x8"
    assert out[f"{step}/zero/gen_kl_error"] == 0.0
    assert out[f"{step}/default/gen_kl_error"] > 0.0
    for mode in ("zero", "default"):
        assert out[f"{step}/{mode}/step_s"] > 0 and out[f"{step}/{mode}/estimate_gb"] > 0
        assert out[f"rl_gen/40x6x8/{mode}/gen_tokens_per_s"] > 0
    assert f"{step}/zero_over_default_time" in out and "rl_gen/40x6x8/zero_over_default" in out


def test_the_device_helpers_reach_torch_cuda(monkeypatch):
    """`_sync` and `_peak_gb` on a (stubbed) CUDA device call torch.cuda, not themselves:
    the CPU smoke run never takes their CUDA branch."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 2e9)
    bench_rl._sync()
    assert calls == ["sync"]
    assert bench_rl._peak_gb() == 2.0


def test_both_modes_are_checked_before_any_work(monkeypatch):
    """The default mode's memory check runs before the policy is built: checked after the
    zero mode's step, it would compare its estimate with what that step left free and
    refuse a shape that fits."""
    checked, built = [], []

    def refuse_default(cfg, task):
        checked.append(cfg.zero_train_gen_mismatch)
        if not cfg.zero_train_gen_mismatch:
            raise ConfigError("needs more memory than is free")

    monkeypatch.setattr(bench_rl, "validate_run", refuse_default)
    monkeypatch.setattr(bench_rl, "build_policy", lambda *a, **k: built.append(1))
    cfg = compose(["tracking.wandb.mode=disabled"], schema=BenchRunConfig)
    with pytest.raises(ConfigError, match="memory"):
        bench_rl.step_rows(cfg, "40x6x8")
    assert checked == [True, False] and built == []

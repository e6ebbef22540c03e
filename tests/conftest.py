"""Shared test helpers: configs composed exactly as `python -m zkl <overrides>` composes them."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from zkl.cert.schema import CertRunConfig
from zkl.lab.schema import BenchRunConfig
from zkl.run.compose import compose
from zkl.run.schema import ZklConfig

os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
os.environ.setdefault("WANDB_DISABLE_CODE", "true")
os.environ.setdefault("WANDB_CONSOLE", "off")
if not torch.cuda.is_available():  # the Triton kernels' logic runs on the CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The interpreter tests run Triton's kernels on a CPU-only machine; a GPU machine runs them
# compiled, in the `gpu` tests.
INTERPRETED = not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") == "1"
NOT_INTERPRETED = "interpreter tests run on CPU-only machines"
if INTERPRETED and importlib.util.find_spec("triton"):
    # a row's dot product gets its own bits on every host CPU, as on a GPU (interpreter_dot)
    import interpreter_dot

    interpreter_dot.install()

# The report's page needs plotly (a dependency); the bare GPU image that runs `-m gpu` may
# lack it, and a module that cannot import would stop the whole collection there
# (tests/test_collection.py collects the GPU run with plotly hidden).
REPORT_TESTS = sorted(
    f"report/{p.name}" for p in (Path(__file__).parent / "report").glob("test_report*.py")
)
collect_ignore = [] if importlib.util.find_spec("plotly") else REPORT_TESTS

QUIET = ["tracking.wandb.mode=disabled", "tracking.progress=false"]
SMALL = ["rl.prompts_per_step=4", "rl.samples_per_prompt=4"]


def small_model(moe: bool = False, seed: int = 3) -> torch.nn.Module:
    """The schema's default-sized Qwen3 (or a 4-expert Qwen3-MoE) in bf16, seeded."""
    from zkl.models.build import build_model
    from zkl.models.config import ModelConfig, MoEConfig

    experts = MoEConfig(num_experts=4, num_experts_per_tok=2, intermediate_size=32)
    cfg = ModelConfig(family="qwen3_moe" if moe else "qwen3", moe=experts if moe else MoEConfig())
    return build_model(cfg, torch.bfloat16, seed=seed)


def fake_gpus(monkeypatch, count: int, free_bytes: int = 10**15) -> None:
    """torch.cuda reporting `count` idle devices (nothing here touches a real one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *device: (free_bytes, free_bytes))


def make_cfg(*overrides: str, quiet: bool = True) -> ZklConfig:
    return compose([*(QUIET if quiet else []), *overrides])


def bench_cfg(*overrides: str) -> BenchRunConfig:
    """The config `python -m zkl.bench <overrides>` runs with (the core keys and bench.*)."""
    return compose([*QUIET, *overrides], schema=BenchRunConfig)


def cert_cfg(*overrides: str) -> CertRunConfig:
    """The config `python -m zkl.cert <overrides>` runs with (the core keys and cert.*)."""
    return compose([*QUIET, *overrides], schema=CertRunConfig)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """A run sets torch's process-wide thread count (zkl/threads.py); later tests get theirs
    back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def rope_tables(head_dim: int, positions: int, theta: float):
    """The model's rotary tables (`.cos`, `.sin`) for one head width, position count and base."""
    from zkl.models.config import ModelConfig, RopeConfig
    from zkl.models.transformer import RotaryEmbedding

    cfg = ModelConfig(
        head_dim=head_dim, max_position_embeddings=positions, rope=RopeConfig(theta=theta)
    )
    return RotaryEmbedding(cfg)


class WandbRuns:
    """What zkl handed to W&B: each run `wandb_run.start` began, and every row it logged."""

    def __init__(self) -> None:
        self.runs: list = []
        self.logged: list[list[tuple[int, dict]]] = []  # per run: (step, row) in order

    def steps(self, index: int = -1) -> list[int]:
        return [step for step, _ in self.logged[index]]


@pytest.fixture
def wandb_runs(monkeypatch) -> WandbRuns:
    """Real W&B runs (offline), each one's `log` calls recorded as they reach wandb.

    metrics.jsonl is the run's record; W&B's offline log is its binary copy, which no public
    reader opens, so a test checks what zkl gave W&B and the run file W&B wrote."""
    from zkl.tracking import wandb_run

    seen = WandbRuns()
    real_start = wandb_run.start

    def start(*args, **kwargs):
        run = real_start(*args, **kwargs)
        if run is not None:
            logged: list[tuple[int, dict]] = []
            real_log = run.log

            def log(row, step=None, **more):
                logged.append((step, dict(row)))
                return real_log(row, step=step, **more)

            run.log = log
            seen.runs.append(run)
            seen.logged.append(logged)
        return run

    monkeypatch.setattr(wandb_run, "start", start)
    return seen

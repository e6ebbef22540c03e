"""How the CUDA benchmarks time a call (CUDA events, or a CUDA graph for microsecond calls)
and print their rows."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def cuda_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of `fn` (CUDA events around each call, after `warmup` calls)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def graph_time(fn: Callable[[], object], calls: int = 20, replays: int = 5) -> float:
    """Seconds per call of `fn`, `calls` calls captured in one CUDA graph and replayed.

    A decode-shaped GEMM runs in microseconds, under the host's launch time: timed call by
    call it measures the launcher, and the scheduler replays graphs anyway.
    """
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return cuda_time(graph.replay, repeats=replays) / calls


def format_table(result: dict) -> str:
    """The result as aligned `key value` lines (floats to 4 significant digits)."""
    lines = []
    for key, value in result.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"{key:60} {text}")
    return "\n".join(lines)

"""How many threads torch's CPU ops get in a run: `num_threads`, else one on a CPU run.

A CPU run is a tiny model (the embedded default's hidden size is 64): each op is a few
microseconds of work, too little for a second thread to pay for its fork and join. And
torch's OpenMP workers spin at each op's end while they wait for the others: where another
job holds a core, one worker is often off it, and at every op the others spin until it runs
again, so step time multiplies with the load (docs/benchmarks.md has the figures). One
thread has no one to wait for. A CUDA run keeps torch's default: its ops run on the GPU.
"""

from __future__ import annotations

import torch

from zkl.device import resolve_device


def run_threads(num_threads: int, device: str) -> int | None:
    """The intra-op thread count for a run: `num_threads` when set, 1 on a CPU run,
    None (torch's default) on a CUDA run."""
    if num_threads:
        return num_threads
    return 1 if resolve_device(device).type == "cpu" else None


def apply(cfg) -> None:
    """Set this process's count by `run_threads` (a dedicated generator gets the same)."""
    threads = run_threads(cfg.num_threads, str(cfg.device))
    if threads is not None:
        torch.set_num_threads(threads)

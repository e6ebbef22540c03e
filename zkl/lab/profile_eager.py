"""Where an eager (no CUDA graphs) decode step's time goes: cProfile of `generate` for
qwen2_5_1_5b at 16 slots, 64-96-token prompts, 64 new tokens.

    python -m zkl.lab.profile_eager [OVERRIDE ...]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from zkl import invariance
from zkl.generation.scheduler import Scheduler
from zkl.lab.workload import MODES, bench_requests
from zkl.layouts.generator_setup import build_generation_model
from zkl.run.compose import compose


def main(overrides: list[str]) -> None:
    cfg = compose(["device=cuda", "model=qwen2_5_1_5b", "tracking.wandb.mode=disabled", *overrides])
    model = build_generation_model(cfg)  # the generator's model: no optimizer, no masters
    requests = bench_requests(16, cfg.model.vocab_size)
    for mode, fixes in MODES.items():
        with invariance.enabled(fixes):
            scheduler = Scheduler(
                model, max_batch_size=16, eos_id=None, sync_every=8, cuda_graphs="off"
            )
            scheduler.generate(requests)  # compile, probes
            torch.cuda.synchronize()
            profiler = cProfile.Profile()
            t0 = time.perf_counter()
            profiler.enable()
            scheduler.generate(requests)
            torch.cuda.synchronize()
            profiler.disable()
            seconds = time.perf_counter() - t0
            steps = scheduler.stats.decode_steps
            print(f"=== eager {mode}: {steps} decode steps, {1e3 * seconds / steps:.2f} ms a step")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main(sys.argv[1:])

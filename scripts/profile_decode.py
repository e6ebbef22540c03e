"""One decode step of qwen2_5_1_5b at batch 64 under torch.profiler, zero and default mode
(issue 11: where a decode step's time goes). Prints the kernel tables; argv[1:] are overrides."""

from __future__ import annotations

import sys

import torch

from zkl import ops
from zkl.experiments.bench_cuda import profile_decode_step
from zkl.experiments.timing import graph_time
from zkl.experiments.workload import MODES
from zkl.ops import fast
from zkl.run.compose import compose
from zkl.trainer.build import build_policy


def main(overrides: list[str]) -> None:
    cfg = compose(["device=cuda", "model=qwen2_5_1_5b", "tracking.wandb.mode=disabled", *overrides])
    model = build_policy(cfg).model
    logits = torch.randn(64, cfg.model.vocab_size, device="cuda")
    seeds, counters = torch.arange(64, device="cuda"), torch.full((64,), 3, device="cuda")
    fused = graph_time(lambda: ops.gumbel_argmax(logits, seeds, counters))
    unfused = graph_time(lambda: fast.gumbel_argmax(logits, seeds, counters))
    print(f"sampling b64: fused {fused * 1e6:.1f} us, torch ops {unfused * 1e6:.1f} us")
    for mode, fixes in MODES.items():
        print(f"=== decode b64 {mode}")
        print(profile_decode_step(model, 64, fixes), flush=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])

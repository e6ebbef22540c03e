"""One decode step of qwen2_5_1_5b at batch 64 under torch.profiler, zero and default mode
(issue 11: where a decode step's time goes). Prints the kernel tables; argv[1:] are overrides."""

from __future__ import annotations

import sys

import torch

from zkl import bench_cuda
from zkl.config import compose
from zkl.rl.policy import Policy


def main(overrides: list[str]) -> None:
    cfg = compose(["device=cuda", "model=qwen2_5_1_5b", "tracking.wandb.mode=disabled", *overrides])
    model = Policy(cfg).model
    for mode, fixes in bench_cuda.MODES.items():
        print(f"=== decode b64 {mode}")
        print(bench_cuda.profile_decode_step(model, 64, fixes), flush=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])

"""The per-GPU memory plan of a run, from zkl's estimator (zkl/memory.py), without a GPU.

    python scripts/memory_plan.py model=qwen3_30b_a3b trainer.world_size=8 task.name=residue

prints each part's GB on one rank's GPU (and the host's share) for the config the overrides
compose, as `python -m zkl device=cuda <overrides>` would check it against each GPU's free
memory before any work. docs/distributed.md holds the plans for the full-depth beds.
"""

from __future__ import annotations

import dataclasses
import sys

from zkl.memory import GB, HOST_ONLY, TRANSIENT, estimate, param_count, peak
from zkl.run.compose import compose
from zkl.run.validate import default_positions


def phase(part: str) -> str:
    """' (phase)' after a part that lives only while its phase of the step runs."""
    return " (phase)" if part in TRANSIENT else ""


def plan(overrides: list[str]) -> str:
    cfg = compose(overrides)
    cfg = dataclasses.replace(cfg, device="cuda:0")  # CUDA's kernels, estimated on any machine
    positions = default_positions(cfg)
    parts = estimate(cfg, positions)
    gpu = {k: v for k, v in parts.items() if k not in HOST_ONLY and v}
    largest_first = sorted(gpu.items(), key=lambda kv: -kv[1])
    lines = [
        f"{cfg.model.name}: {param_count(cfg.model) / 1e9:.2f} B parameters, "
        f"{cfg.model.num_hidden_layers} layers, trainer.world_size={cfg.trainer.world_size}, "
        f"{positions} positions",
        *(f"  {k + phase(k):<42} {v / GB:8.1f} GB" for k, v in largest_first),
        f"  {'per GPU (the largest phase)':<42} {peak(gpu) / GB:8.1f} GB",
        f"  {'host, per rank':<42} {sum(parts.get(k, 0.0) for k in HOST_ONLY) / GB:8.1f} GB",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(plan(sys.argv[1:]))

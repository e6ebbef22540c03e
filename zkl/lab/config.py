"""`bench.*` (python -m zkl.bench) and the check of its own keys; a leaf that
`zkl.lab.schema` adds to the core's."""

from __future__ import annotations

from dataclasses import dataclass, field

from zkl.errors import ConfigError


@dataclass
class BenchConfig:
    """`python -m zkl.bench` on CUDA: the short table, or RL shapes (PROMPTxRESPONSExROLLOUTS)."""

    workload: str = "short"  # short (zkl.lab.bench_cuda's table) | rl (zkl.lab.bench_rl)
    gen_shapes: list[str] = field(
        default_factory=lambda: [
            "1024x1024x64", "1024x4096x64", "4096x1024x64", "4096x4096x64",
            "1024x1024x256", "4096x1024x256",
        ]
    )  # fmt: skip
    step_shapes: list[str] = field(default_factory=lambda: ["4096x4096x64"])


def check_bench(bench: BenchConfig, on_cuda: bool) -> None:
    """One sentence naming the bench.* key whose value cannot work (on this device)."""
    if bench.workload not in ("short", "rl"):
        raise ConfigError(f"bench.workload={bench.workload!r} must be short or rl.")
    if bench.workload == "rl" and not on_cuda:
        raise ConfigError("bench.workload=rl times long CUDA workloads; use device=cuda.")
    for key in ("gen_shapes", "step_shapes"):
        for shape in getattr(bench, key):
            parts = str(shape).lower().split("x")
            if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ConfigError(
                    f"bench.{key} holds {shape!r}; each shape is PROMPTxRESPONSExROLLOUTS, "
                    "e.g. 4096x4096x64."
                )
            if int(parts[0]) <= 32 or int(parts[2]) % 8:
                raise ConfigError(
                    f"bench.{key} holds {shape!r}: the prompt must be over 32 tokens (the "
                    "residue task's prefix) and the rollouts a multiple of 8."
                )

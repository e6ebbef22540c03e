"""The benchmark's schema: the core `ZklConfig` extended with `bench.*`.

`python -m zkl.bench` puts `BenchRunConfig` in Hydra's ConfigStore (`zkl.run.register`), so
`python -m zkl bench.workload=rl` is an unknown key and every training run's config holds
only what a training run reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zkl.lab.config import BenchConfig
from zkl.run.schema import ZklConfig


@dataclass
class BenchRunConfig(ZklConfig):
    """What `python -m zkl.bench` times: a run's config and the CUDA workloads."""

    bench: BenchConfig = field(default_factory=BenchConfig)

"""The experiments' schemas: the core `ZklConfig` extended with their own keys.

`python -m zkl.cert` composes `CertRunConfig` (the core keys and `cert.*`), `python -m
zkl.bench` composes `BenchRunConfig` (the core keys and `bench.*`); each entry point puts its
schema in Hydra's ConfigStore (`zkl.run.register`), so `python -m zkl cert.steps=2` is an
unknown key and every training run's config holds only what a training run reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zkl.experiments.config import BenchConfig, CertConfig
from zkl.run.schema import ZklConfig


@dataclass
class CertRunConfig(ZklConfig):
    """What `python -m zkl.cert` certifies: a run's config and the bed axes."""

    cert: CertConfig = field(default_factory=CertConfig)


@dataclass
class BenchRunConfig(ZklConfig):
    """What `python -m zkl.bench` times: a run's config and the CUDA workloads."""

    bench: BenchConfig = field(default_factory=BenchConfig)

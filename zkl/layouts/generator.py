"""Where the generator runs relative to the trainer, and how weights reach it.

`colocated`: in the trainer's process, on its weights. `dedicated`: a process of its own
(`supervisor` watches it, `worker` is its loop), refitted over a `transport` in the `wire`
format. Both build their model and scheduler with `generator_setup` and take weights in through
`refit`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from zkl.generation.scheduler import Completion, Request, SchedulerStats
from zkl.layouts.colocated import ColocatedGenerator
from zkl.layouts.dedicated import DedicatedGenerator


class Generator(Protocol):
    """What the training loop needs from a generator, wherever it runs."""

    def generate(self, requests: list[Request]) -> tuple[list[Completion], SchedulerStats]: ...

    def refit(self, state: dict[str, torch.Tensor], version: int) -> None: ...

    def configure(self, max_batch_size: int | None, prefill_chunk: int | None) -> None: ...

    def close(self) -> None: ...


def build_generator(cfg, policy, eos_id: int, run_dir=None) -> Generator:
    """The configured layout's generator; a dedicated one keeps its stderr in `run_dir`."""
    if cfg.layout.name == "dedicated":
        return DedicatedGenerator(cfg, eos_id, run_dir, policy.world.rank)
    return ColocatedGenerator(cfg, policy, eos_id)

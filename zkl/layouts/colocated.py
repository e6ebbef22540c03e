"""Colocated: the generator runs in the trainer's process on the trainer's own weights."""

from __future__ import annotations

import torch

from zkl.generation.scheduler import Completion, Request, SchedulerStats
from zkl.layouts.generator_setup import build_generation_model, build_scheduler
from zkl.layouts.refit import load_refit, refit_payload, refits_exactly
from zkl.precision.recipes import DTYPES


class ColocatedGenerator:
    """Shares the trainer's model object, so a refit moves no bytes.

    With `refit_exactness` off it keeps its own copy, loaded the lossy way a converting
    refit would (every tensor cast to the compute dtype). A sharded trainer's rank holds
    shards only: its generator keeps whole weights, refitted in place from the all-gather.
    """

    def __init__(self, cfg, policy, eos_id: int):
        self.shared = refits_exactly() and not policy.world.sharded
        model = policy.model if self.shared else build_generation_model(cfg)
        self.scheduler = build_scheduler(cfg, model, eos_id)
        self.gen_dtype = DTYPES[cfg.precision.compute_dtype]

    def generate(self, requests: list[Request]) -> tuple[list[Completion], SchedulerStats]:
        completions = self.scheduler.generate(requests)
        return completions, self.scheduler.stats

    def refit(self, state: dict[str, torch.Tensor], version: int) -> None:
        if not self.shared:
            load_refit(self.scheduler.model, refit_payload(state, self.gen_dtype))
        self.scheduler.on_refit(version)

    def configure(self, max_batch_size: int | None, prefill_chunk: int | None) -> None:
        self.scheduler.configure(max_batch_size, prefill_chunk)

    def close(self) -> None:
        pass

"""The generator's own model and its scheduler, set up the same way in every layout."""

from __future__ import annotations

import torch

from zkl.device import generator_device
from zkl.engine_model import build_engine_model
from zkl.generation.scheduler import Scheduler
from zkl.precision.recipes import DTYPES


def build_scheduler(cfg, model: torch.nn.Module, eos_id: int | None) -> Scheduler:
    """The scheduler over `model`; `sampling.ignore_eos` turns EOS off (fixed-length responses)."""
    return Scheduler(
        model,
        max_batch_size=cfg.scheduler.max_batch_size,
        eos_id=None if cfg.sampling.ignore_eos else eos_id,
        kv_mode=cfg.kv.mode,
        prefill_chunk=cfg.scheduler.prefill_chunk,
        prefix_cache_blocks=cfg.scheduler.prefix_cache_blocks,
        sync_every=cfg.scheduler.sync_every,
        cuda_graphs=cfg.scheduler.cuda_graphs,
        record_routes=cfg.rl.records_routes,
    )


def build_generation_model(cfg) -> torch.nn.Module:
    """The generator's own copy of the architecture (weights arrive with the first refit),
    on the generator's device (`layout.generator_device` with `layout.transport=nccl`)."""
    return build_engine_model(
        cfg.model,
        DTYPES[cfg.precision.compute_dtype],
        cfg.precision.linear_quant,
        cfg.seed,
        generator_device(cfg),
        cfg.engine.name,
    )

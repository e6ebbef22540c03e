"""Where the generation engine runs relative to the trainer, and how weights reach it."""

from __future__ import annotations

from typing import Protocol

import torch

from zkl.device import generator_device
from zkl.generation.engine import Completion, EngineStats, GenerationEngine, Request
from zkl.invariance import is_enabled
from zkl.models import build_model
from zkl.precision import DTYPES


class Generator(Protocol):
    """What the training loop needs from a generation engine, wherever it runs."""

    def generate(self, requests: list[Request]) -> tuple[list[Completion], EngineStats]: ...

    def refit(self, state: dict[str, torch.Tensor], version: int) -> None: ...

    def configure(self, max_batch_size: int | None, prefill_chunk: int | None) -> None: ...

    def close(self) -> None: ...


def refit_payload(
    state: dict[str, torch.Tensor], gen_dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """What a refit sends: the trainer's exact tensors, or (fix off) all cast to `gen_dtype`."""
    if is_enabled("refit_exactness"):
        return state
    return {k: v.to(gen_dtype) if v.is_floating_point() else v for k, v in state.items()}


def load_refit(model: torch.nn.Module, payload: dict[str, torch.Tensor]) -> None:
    """Copy a complete payload into the model's parameters in place, or change nothing."""
    params = dict(model.named_parameters())
    if set(params) != set(payload):
        missing = sorted(set(params) ^ set(payload))
        raise RuntimeError(f"refit payload does not match the model's parameters: {missing[:4]}")
    shape = getattr(payload, "shape", lambda name: payload[name].shape)  # lazy: no gather
    for name, p in params.items():
        if p.shape != shape(name):
            raise RuntimeError(f"refit tensor {name} has shape {tuple(shape(name))}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(payload[name])


def sync_every(cfg, device: torch.device) -> int:
    """`engine.sync_every`, with 0 meaning 1 on the CPU and 8 on a GPU."""
    if cfg.engine.sync_every:
        return cfg.engine.sync_every
    return 8 if device.type == "cuda" else 1


def build_engine(cfg, model: torch.nn.Module, eos_id: int | None) -> GenerationEngine:
    """The engine over `model`; `sampling.ignore_eos` turns EOS off (fixed-length responses)."""
    device = model.embed_tokens.weight.device
    return GenerationEngine(
        model,
        max_batch_size=cfg.engine.max_batch_size,
        eos_id=None if cfg.sampling.ignore_eos else eos_id,
        kv_mode=cfg.kv.mode,
        prefill_chunk=cfg.engine.prefill_chunk,
        prefix_cache_blocks=cfg.engine.prefix_cache_blocks,
        sync_every=sync_every(cfg, device),
        cuda_graphs=cfg.engine.cuda_graphs,
    )


def build_generation_model(cfg) -> torch.nn.Module:
    """The generator's own copy of the architecture (weights arrive with the first refit),
    on the generator's device (`layout.generator_device` with `layout.backend=nccl`)."""
    return build_model(
        cfg.model,
        DTYPES[cfg.precision.compute_dtype],
        cfg.precision.linear_quant,
        cfg.seed,
        generator_device(cfg),
        cfg.engine.backend,
    )


def build_generator(cfg, policy, eos_id: int, run_dir=None) -> Generator:
    """The configured layout's generator; a dedicated one keeps its stderr in `run_dir`."""
    if cfg.layout.name == "dedicated":
        from zkl.layouts.dedicated import DedicatedGenerator

        return DedicatedGenerator(cfg, eos_id, run_dir, policy.world.rank)
    from zkl.layouts.colocated import ColocatedGenerator

    return ColocatedGenerator(cfg, policy, eos_id)

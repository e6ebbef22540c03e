"""The config check of the `trainer` group: one sentence naming the key, before any work."""

from __future__ import annotations

from typing import Any

from zkl.device import on_cuda
from zkl.engines import NATIVE, engine_named
from zkl.errors import ConfigError
from zkl.placement import own_gpu


def sharded(cfg: Any) -> bool:
    """Whether the trainer's model is sharded with FSDP2 (`trainer.fsdp`, null: world_size > 1)."""
    t = cfg.trainer
    return t.world_size > 1 if t.fsdp is None else bool(t.fsdp)


def check_trainer(cfg: Any) -> None:
    t = cfg.trainer
    if t.world_size < 1:
        raise ConfigError(f"trainer.world_size={t.world_size} must be >= 1.")
    if t.process_group not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"trainer.process_group={t.process_group!r} must be auto, gloo or nccl.")
    for key in ("timeout_s", "heartbeat_s"):
        if getattr(t, key) <= 0:
            raise ConfigError(f"trainer.{key}={getattr(t, key)} must be positive.")
    engine = engine_named(cfg.engine.name)
    if t.activation_checkpointing and not engine.activation_checkpointing:
        raise ConfigError(
            f"trainer.activation_checkpointing=true remakes the native models' layers; "
            f"engine.name={engine.name!r} has its own; use engine={NATIVE.name} or set "
            "trainer.activation_checkpointing=false."
        )
    if t.activation_checkpointing and cfg.rl.records_routes:
        raise ConfigError(
            "trainer.activation_checkpointing=true remakes each MoE layer in the backward, "
            "where the route tape does not replay; set it false with rl.routing_replay or "
            "rl.record_routes."
        )
    if not sharded(cfg):
        if t.offload:
            raise ConfigError("trainer.offload=true offloads FSDP2 shards; set trainer.fsdp=true.")
        return
    cuda = on_cuda(cfg)
    if t.offload and not cuda:
        raise ConfigError(
            "trainer.offload=true moves GPU shards to the host; it needs device=cuda."
        )
    if t.process_group == "nccl" and not cuda:
        raise ConfigError(
            "trainer.process_group=nccl needs device=cuda; use gloo (or auto) on the CPU."
        )
    if not engine.sharded:
        raise ConfigError(
            f"engine.name={engine.name!r} runs in one process; use engine={NATIVE.name} with "
            f"trainer.world_size={t.world_size} (or trainer.world_size=1)."
        )
    if ":" in str(cfg.device) and t.world_size > 1:
        raise ConfigError(
            f"device={cfg.device!r} names one GPU, but each of the trainer.world_size="
            f"{t.world_size} ranks takes the GPU of its local rank; use device=cuda."
        )
    if own_gpu(cfg.layout.name, cfg.layout.transport):
        raise ConfigError(
            "layout.transport=nccl puts one generator on a GPU of its own, which a sharded "
            "trainer does not have; use layout.transport=auto (CUDA IPC) or +layout=colocated."
        )
    samples = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
    smallest = samples // max(cfg.rl.num_minibatches, 1)
    if smallest < t.world_size:
        raise ConfigError(
            f"a minibatch of {smallest} sequences cannot give each of the trainer.world_size="
            f"{t.world_size} ranks one; lower trainer.world_size or rl.num_minibatches, or "
            "raise rl.prompts_per_step."
        )

"""The `trainer` config group: how many trainer ranks share the training, and how they talk."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerConfig:
    # Trainer ranks, one process (and, on CUDA, one GPU) each. Above 1 the model is sharded
    # with FSDP2 and each rank's own generator takes its share of the step's requests.
    # `python -m zkl trainer.world_size=N` starts the N ranks on this machine itself; under
    # torchrun or a Slurm job of N tasks it joins the ranks they started.
    world_size: int = 1
    # FSDP2 at world size 1 as well (null: on when world_size > 1); the path a one-GPU run
    # takes to compare it with the single-process one.
    fsdp: bool | None = None
    # Keep the fp32 shards, their gradients and AdamW's moments in host memory (FSDP2's
    # CPUOffloadPolicy; the optimizer steps on the CPU): what lets a 30B model's trainer and
    # its whole-model generator share one H200 each (docs/distributed.md). CUDA only.
    offload: bool = False
    # The trainer ranks' torch.distributed process group: gloo or nccl (auto: gloo on the
    # CPU, nccl on CUDA).
    process_group: str = "auto"
    # Keep each layer's input only and remake its activations in the backward (the native
    # engine's models): the update then holds one layer's activations, not every layer's,
    # for about a third more train-path compute; the gradients are bitwise unchanged.
    activation_checkpointing: bool = False
    timeout_s: float = 600.0  # a collective waits this long for a live but silent peer
    # A rank whose heartbeat is this old is reported gone by every other rank, which stops.
    heartbeat_s: float = 5.0


def tasks_per_node(world_size: int, nodes: int) -> int:
    """Slurm tasks on each node for `trainer.world_size` ranks over `hydra.launcher.nodes`."""
    if nodes < 1 or world_size % nodes:
        raise ValueError(
            f"trainer.world_size={world_size} ranks do not split evenly over "
            f"hydra.launcher.nodes={nodes}; choose a world size that is a multiple of it."
        )
    return world_size // nodes

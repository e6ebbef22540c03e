"""Where a dedicated generator runs: on the trainer's device, or on a GPU of its own. The one
rule (`own_gpu`), which the generator's device, the memory estimate, the sharded trainer's
check and the GPUs a Slurm job asks for all read.

A dedicated generator whose refit goes over NCCL (`layout.transport=nccl`) has a GPU of its
own; every other generator shares the trainer's device (a dedicated one with the default
transport over CUDA IPC). Pure, importing nothing: Hydra's resolvers call it while composing.
"""

from __future__ import annotations

OWN_GPU_TRANSPORT = "nccl"  # the transport that gives a dedicated generator a GPU of its own


def own_gpu(layout: str, transport: str) -> bool:
    """Whether the generator of `layout.name=layout` with `layout.transport=transport` has a
    GPU of its own."""
    return layout == "dedicated" and transport == OWN_GPU_TRANSPORT


def layout_gpus(layout: str, transport: str = "auto") -> int:
    """GPUs a run needs on a GPU device: one, or two for a generator with its own."""
    return 2 if own_gpu(layout, transport) else 1


def node_gpus(layout: str, transport: str, tasks: int) -> int:
    """GPUs of a Slurm node with `tasks` trainer ranks: one a rank, or two for the one rank
    whose generator has its own."""
    return 2 if own_gpu(layout, transport) else tasks

"""How the refit buffer travels between the trainer (rank 0) and its generator (rank 1).

On the CPU (`gloo`) it is broadcast from the trainer to the generator; on one GPU
(`cuda_ipc`) the pipe carries a CUDA IPC handle to the trainer's buffer, so the generator
copies device to device with no host round trip; with the generator on a GPU of its own
(`nccl`) it is broadcast GPU to GPU over NCCL. The broadcast transports rendezvous through
a FileStore: no socket to the outside.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

from zkl.device import generator_device, on_cuda, resolve_device
from zkl.loopback import loopback_only

BROADCAST = ("gloo", "nccl")  # the transports that move the buffer with torch.distributed

_PRIVATE: list = []  # a sharded trainer's refit group: its default group is its ranks'


def kind(cfg) -> str:
    """`layout.transport` with `auto` resolved: gloo on the CPU, cuda_ipc on a GPU."""
    if cfg.layout.transport != "auto":
        return cfg.layout.transport
    return "cuda_ipc" if on_cuda(cfg) else "gloo"


def rendezvous_file() -> str:
    """A fresh file for the two ranks' FileStore, in a directory only this user can enter.

    torch's TCPStore binds every interface whatever host it is given, and has no
    authentication: on a shared node anyone could reach it for the run's whole lifetime. A
    FileStore opens no socket. Local temporary storage, not the run directory: a FileStore
    locks its file, which network file systems do unreliably.
    """
    return os.path.join(tempfile.mkdtemp(prefix="zkl-rendezvous-"), "store")


def landing_device(cfg, rank: int) -> torch.device:
    """Where rank `rank`'s broadcast buffer lives: its GPU over NCCL, else host memory."""
    if kind(cfg) != "nccl":
        return torch.device("cpu")
    return resolve_device(cfg.device) if rank == 0 else generator_device(cfg)


def _init_private_group(cfg, store_file: str, rank: int) -> None:
    """The two-rank gloo group of one trainer rank and its generator, outside the default
    group (which, in a sharded trainer, holds the trainer's ranks); a FileStore, no socket."""
    timeout = timedelta(seconds=cfg.layout.timeout_s)
    loopback_only()
    store = dist.FileStore(store_file, 2)
    _PRIVATE[:] = [store, dist.ProcessGroupGloo(store, rank, 2, timeout)]


def init_group(cfg, store_file: str, rank: int, private: bool = False) -> None:
    """The two-rank group of a broadcast transport; rank 0 the trainer, rank 1 the generator."""
    if private:
        return _init_private_group(cfg, store_file, rank)
    transport = kind(cfg)
    device = landing_device(cfg, rank)
    if transport == "nccl":
        torch.cuda.set_device(device)
    loopback_only()
    dist.init_process_group(
        transport,  # gloo or nccl: a broadcast transport is torch.distributed's backend
        store=dist.FileStore(store_file, 2),
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=cfg.layout.timeout_s),
        device_id=device if transport == "nccl" else None,
    )


def broadcast(flat: torch.Tensor) -> None:
    """Rank 0's `flat` into the other's: over the private group when there is one."""
    if _PRIVATE:
        _PRIVATE[1].broadcast(flat, 0).wait()
    else:
        dist.broadcast(flat, src=0)


def abort_group(private: bool = False) -> None:
    """Tear the group down; NCCL's is aborted, so a peer that is gone cannot hang it."""
    if private:
        _PRIVATE.clear()
        return
    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()
            return
    dist.destroy_process_group()

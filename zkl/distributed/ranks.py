"""The trainer's ranks: who this process is, and the few collectives the loop needs.

At world size 1 (the default) every method is the identity and no process group exists, so
the single-process run is unchanged. Above 1 each rank generates and scores a contiguous
share of the step's requests (`share`), and `gather` puts the shares back together in rank
order on every rank, so whatever is computed from the gathered lists is computed from the
same values in the same order as in one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from zkl.device import on_cuda
from zkl.distributed.checks import sharded
from zkl.errors import ConfigError
from zkl.loopback import free_port, loopback_only

T = TypeVar("T")


def bounds(count: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous share [lo, hi) of `count` items; sizes differ by at most 1."""
    return count * rank // size, count * (rank + 1) // size


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    sharded: bool = False  # the trainer's model is FSDP2-sharded (also at size 1)
    watchdog: Any = field(default=None, repr=False)  # zkl/distributed/watchdog.py

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, items: list[T]) -> list[T]:
        lo, hi = bounds(len(items), self.rank, self.size)
        return items[lo:hi]

    def gather(self, items: list[T]) -> list[T]:
        """Every rank's list, concatenated in rank order, on every rank."""
        if self.size == 1:
            return items
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, items)
        return [x for part in parts for x in part]

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over the ranks (float64, the same order on every rank)."""
        if self.size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def any(self, flag: bool) -> bool:
        if self.size == 1:
            return flag
        return self.sum([float(flag)])[0] > 0

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @property
    def device(self) -> torch.device:
        """Where this rank's collectives put small tensors (NCCL needs them on the GPU)."""
        if dist.is_initialized() and dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


_OWN_ENV: list[str] = []  # the variables `init` set for a group of one


def process_group_kind(cfg: Any) -> str:
    """`trainer.process_group` with `auto` resolved: gloo on the CPU, nccl on CUDA."""
    if cfg.trainer.process_group != "auto":
        return cfg.trainer.process_group
    return "nccl" if on_cuda(cfg) else "gloo"


_GROUP_OF_ONE: list[Any] = []  # the default group `group_of_one` made, while it is the default


def group_of_one() -> None:
    """A default group of this process alone (gloo over an in-memory store), for a library
    that needs one outside a sharded run (megatron-core's parallel state). A sharded run
    started later in the same process replaces it (`init`)."""
    loopback_only()  # one rank: an in-memory store, no TCPStore on every interface
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    _GROUP_OF_ONE[:] = [dist.distributed_c10d._get_default_group()]


def _release_group_of_one() -> None:
    """Leave `group_of_one`'s group before a run's own; refuse a default group zkl did not make."""
    if not dist.is_initialized():
        return
    if _GROUP_OF_ONE and _GROUP_OF_ONE[0] is dist.distributed_c10d._get_default_group():
        _GROUP_OF_ONE.clear()
        dist.destroy_process_group()
        return
    raise ConfigError(
        "this process already has a torch.distributed default group that zkl did not create, "
        "and a sharded run (trainer.fsdp=true or trainer.world_size > 1) makes its own: start "
        "the run in its own process (python -m zkl), or set trainer.fsdp=false."
    )


def init(cfg: Any) -> World:
    """Join the process group of the ranks the launcher started (or a group of one for
    `trainer.fsdp=true` at world size 1); set this rank's GPU. World() when not sharded.
    The caller hands the World to what reads it (the policy, the Saver): no process-wide
    copy is kept."""
    if not sharded(cfg):
        return World()
    _release_group_of_one()
    if "WORLD_SIZE" not in os.environ:  # world size 1 through the FSDP path
        own = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(free_port())}
        own.update({} if "MASTER_ADDR" in os.environ else {"MASTER_ADDR": "127.0.0.1"})
        os.environ.update(own)
        _OWN_ENV[:] = list(own)  # removed again by shutdown(): a later run is not a rank
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    kind = process_group_kind(cfg)
    device = None
    if kind == "nccl" or on_cuda(cfg):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        kind,
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=cfg.trainer.timeout_s),
        device_id=device if kind == "nccl" else None,
    )
    return World(rank, size, local_rank, sharded=True)


def shutdown() -> None:
    """Leave the process group; NCCL's is aborted so that a peer that is gone cannot hang it."""
    for key in _OWN_ENV:
        os.environ.pop(key, None)
    _OWN_ENV.clear()
    _GROUP_OF_ONE.clear()
    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        try:
            dist.distributed_c10d._abort_process_group()
            return
        except Exception:  # an older torch: destroy instead
            pass
    dist.destroy_process_group()

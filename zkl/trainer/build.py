"""Which policy a run trains: the one place the trainer's mode is decided."""

from __future__ import annotations

from zkl import distributed
from zkl.trainer.local import LocalPolicy
from zkl.trainer.policy import Policy
from zkl.trainer.sharded import ShardedPolicy


def build_policy(cfg) -> Policy:
    """FSDP2's sharded policy when this process is a sharded trainer's rank
    (zkl/distributed/__init__.py `init`), else the single-process one."""
    return ShardedPolicy(cfg) if distributed.current().sharded else LocalPolicy(cfg)

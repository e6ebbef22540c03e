"""Which policy a run trains: the one place the trainer's mode is decided."""

from __future__ import annotations

from zkl.distributed import ranks
from zkl.trainer.local import LocalPolicy
from zkl.trainer.policy import Policy
from zkl.trainer.sharded import ShardedPolicy
from zkl.trainer.update import LossFn


def build_policy(cfg, loss_fn: LossFn | None = None) -> Policy:
    """FSDP2's sharded policy when this process is a sharded trainer's rank
    (`zkl.distributed.ranks.init`), else the single-process one; its updates minimize
    `loss_fn` (zkl/rl/loss.py), a policy that only scores needs none."""
    policy = ShardedPolicy if ranks.current().sharded else LocalPolicy
    return policy(cfg, loss_fn)

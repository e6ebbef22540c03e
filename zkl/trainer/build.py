"""Which policy a run trains: the one place the trainer's mode is decided."""

from __future__ import annotations

from zkl.distributed import ranks
from zkl.trainer.local import LocalPolicy
from zkl.trainer.policy import Policy
from zkl.trainer.sharded import ShardedPolicy
from zkl.trainer.update import LossFn


def build_policy(cfg, loss_fn: LossFn | None = None, world: ranks.World | None = None) -> Policy:
    """FSDP2's sharded policy when `world` is a sharded trainer's rank (what
    `zkl.distributed.ranks.init` returned), else the single-process one (also without a
    world); its updates minimize `loss_fn` (zkl/rl/loss.py), a policy that only scores needs
    none."""
    world = world if world is not None else ranks.World()
    policy = ShardedPolicy if world.sharded else LocalPolicy
    return policy(cfg, loss_fn, world)

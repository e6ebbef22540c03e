"""Sharded checkpoints: each rank writes its own shards with torch.distributed.checkpoint
(the sharded policy's whole state dict: weights, AdamW state and the weight version).

`checkpoint.pt` stays the one file that says where a run stands (step, W&B id, config,
every rank's RNG state, requeue flag), written by rank 0 after every rank's shards are on
disk, with its own digest (zkl/state/checkpoint_file.py); its `shards` names the directory of that
step's shards, `checkpoint_shards/step_N`, and `shard_digests` each rank's digest of its
shards, checked after loading them, so damaged shard files never start a resume.
A run killed while saving keeps the previous `checkpoint.pt` and the shards it names; older
shard directories are removed only after the new `checkpoint.pt` is in place.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from zkl.errors import ConfigError
from zkl.state import checkpoint_file, resume
from zkl.state.config import CHECKPOINT_FILE

SHARDS_DIR = "checkpoint_shards"


def prepare(cfg: Any, run_dir: str | Path, world) -> resume.Resume:
    """`zkl.state.resume.prepare` on rank 0 (it trims the logs), its outcome on every rank."""
    if world.size == 1:
        return resume.prepare(cfg, run_dir)
    outcome: Any = None
    if world.is_main:
        try:
            outcome = resume.prepare(cfg, run_dir)
        except ConfigError as err:
            outcome = err
    outcome = world.broadcast(outcome)
    if isinstance(outcome, ConfigError):
        raise outcome
    return outcome


def _local(tree: Any) -> Any:
    """`tree` with each DTensor replaced by this rank's shard of it (what this rank saves)."""
    if isinstance(tree, DTensor):
        return tree.to_local()
    if isinstance(tree, dict):
        return {k: _local(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_local(v) for v in tree)
    return tree


def shard_digest(state: dict[str, Any]) -> str:
    """sha256 of this rank's shards of `state` (zkl/state/checkpoint_file.py's digest)."""
    return checkpoint_file.digest({"shards": _local(state)})


def _rng() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
    }


def save(run_dir: str | Path, cfg: Any, policy, next_step: int, log, requeue: bool) -> None:
    """Every rank's shards, then rank 0's `checkpoint.pt` naming them (a collective)."""
    world = policy.world
    run_dir = Path(run_dir)
    name = f"{SHARDS_DIR}/step_{next_step:06d}"
    state = policy.state_dict()
    dcp.save(state, checkpoint_id=str(run_dir / name))
    rngs = world.gather([_rng()])
    digests = world.gather([shard_digest(state)])  # also: every rank's shards are written
    if world.is_main:
        meta = {
            "step": next_step,
            "shards": name,
            "version": policy.version,
            "world_size": world.size,
            "rng": rngs,
            "shard_digests": digests,
            "wandb_id": log.wandb_id,
            "config": resume.config_dict(cfg),
            "requeue": requeue,
        }
        checkpoint_file.write(run_dir / CHECKPOINT_FILE, meta)
        for old in (run_dir / SHARDS_DIR).iterdir():
            if old.name != Path(name).name:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def restore(start: resume.Resume, policy, run_dir: str | Path) -> None:
    """Load this rank's shards and RNG state from the checkpoint `start` read."""
    state = start.state
    world = policy.world
    if state["world_size"] != world.size:
        raise ConfigError(
            f"the checkpoint holds shards of {state['world_size']} ranks; resume it with "
            f"trainer.world_size={state['world_size']}."
        )
    target = policy.state_dict()
    shards = Path(run_dir) / state["shards"]
    try:
        dcp.load(target, checkpoint_id=str(shards))
        intact = shard_digest(target) == state["shard_digests"][world.rank]
    except Exception:  # a missing or unreadable shard file
        intact = False
    damaged = [rank for rank, ok in enumerate(world.gather([intact])) if not ok]
    if damaged:  # every rank refuses together, none waits on a collective
        raise ConfigError(
            f"{shards} does not hold the shards {CHECKPOINT_FILE} names (rank "
            f"{damaged[0]}'s are missing or damaged); delete {CHECKPOINT_FILE} to "
            "rerun from step 0 with resume=true, or start afresh in another hydra.run.dir."
        )
    policy.load_state_dict(target)
    rng = state["rng"][world.rank]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])

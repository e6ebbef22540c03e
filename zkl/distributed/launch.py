"""Starting and joining the trainer's ranks.

Three launchers start the same `run` in every rank: `python -m zkl trainer.world_size=N`
alone spawns the N ranks on this machine (`spawn`); under `torchrun --nproc-per-node N` the
ranks find their place in torchrun's environment; in a Slurm job of N tasks
(`hydra/launcher=slurm_gpu` with `tasks_per_node`/`nodes`) in submitit's. Each rank runs a
heartbeat (zkl/distributed/watchdog.py), so a rank that dies is reported within seconds by
every other one, whichever collective they wait in.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from zkl.console import say
from zkl.distributed import ranks
from zkl.distributed.checks import sharded
from zkl.distributed.watchdog import Watchdog
from zkl.environment import preempt_signal
from zkl.errors import ConfigError, RunFault
from zkl.loopback import free_port
from zkl.tracking.run_log import read_metrics

RunFn = Callable[[Any, str, bool | None], Any]  # zkl.rl.loop.run(cfg, run_dir, progress)

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SPAWNED_KEY = "ZKL_SPAWNED_RANK"  # set in the ranks `spawn` starts


def _slurm_tasks() -> int:
    """The tasks of this Slurm job step when submitit runs it (0 outside submitit's Slurm)."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return 0
    return int(os.environ.get("SLURM_NTASKS") or 1)


def must_spawn(cfg: Any) -> bool:
    """Whether this process starts the ranks itself: no launcher started them."""
    size = cfg.trainer.world_size
    return sharded(cfg) and size > 1 and "WORLD_SIZE" not in os.environ and _slurm_tasks() < 2


def owns_run_dir() -> bool:
    """Whether this process takes the run directory's lock (zkl/state/run_lock.py): a process no
    launcher started, or rank 0 of torchrun's or Slurm's ranks; a rank `spawn` started runs
    under its spawner's lock."""
    if os.environ.get(SPAWNED_KEY) == "1":
        return False
    return int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0) == 0


def join(cfg: Any) -> ranks.World:
    """This process's rank of the run (World() for a single-process run)."""
    if _slurm_tasks() > 1 and "WORLD_SIZE" not in os.environ:
        from submitit.helpers import TorchDistributedEnvironment  # optional: Slurm runs only

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    launched = int(os.environ.get("WORLD_SIZE") or 1)
    if launched > 1 and launched != cfg.trainer.world_size:
        raise ConfigError(
            f"the launcher started {launched} ranks but trainer.world_size="
            f"{cfg.trainer.world_size}; set trainer.world_size={launched}."
        )
    world = ranks.init(cfg)
    if world.size > 1:
        world.watchdog = Watchdog(world, cfg.trainer.heartbeat_s)
        world.watchdog.start()
    return world


def leave(world: ranks.World, finished: bool) -> None:
    """Stop the heartbeat and leave the group; after a finished run, wait for every rank
    first (rank 0 holds the rendezvous store the others still read)."""
    watchdog = getattr(world, "watchdog", None)
    if watchdog is not None:
        if finished:
            dist.barrier()
        watchdog.stop()
    ranks.shutdown()


def _exit_flushed() -> None:
    """End a finished rank at once, its output flushed (os._exit skips Python's own flush)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _rank_main(
    run: RunFn, cfg: Any, run_dir: str, progress: bool | None, env: dict[str, str]
) -> None:
    """One spawned rank: `run` with the launcher's environment; its failure is one line."""
    os.environ.update(env)
    prefix = f"zkl: rank {env['RANK']} of {env['WORLD_SIZE']}"
    try:
        run(cfg, run_dir, progress)
        # The run has closed its logs and left the process group. Return, so multiprocessing
        # runs its finalizers (a semaphore this rank made, such as tqdm's lock, is unlinked;
        # skipped, the spawner's resource tracker warns of a leak), then skip the rest of the
        # interpreter's teardown: a gloo or store thread still alive in C++ can abort it
        # ("terminate called without an active exception", SIGABRT) and turn a finished rank
        # into a failed one. The first exit handler to run is the last registered: this one.
        atexit.register(_exit_flushed)
    except ConfigError as err:
        say(f"{prefix}: {err}")
        sys.exit(2)
    except RunFault as err:
        say(f"{prefix}: {err}")
        sys.exit(1)
    except KeyboardInterrupt as err:  # a second Ctrl-C: rank 0 says where the run stands
        if str(err) and env["RANK"] == "0":
            say(f"zkl: interrupted; {err}.")
        sys.exit(130)


def spawn(run: RunFn, cfg: Any, run_dir: str | Path, progress: bool | None) -> list[dict[str, Any]]:
    """Run `run(cfg, run_dir, progress)` in `trainer.world_size` ranks on this machine (the
    loop passes itself: a module-level function, so each spawned process imports it by
    name); return rank 0's metric rows.

    SIGTERM and the preemption signal are passed on to every rank, Ctrl-C as SIGTERM (they
    stop together at a step boundary and save). When a rank fails, the others report it and
    stop by themselves (their heartbeat); any still running after `trainer.heartbeat_s` + 10 s
    are killed.
    """
    size = cfg.trainer.world_size
    common = {
        SPAWNED_KEY: "1",
        "WORLD_SIZE": str(size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(size):
        env = {**common, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(ctx.Process(target=_rank_main, args=(run, cfg, str(run_dir), progress, env)))
    forwarded: dict[int, Any] = {}

    def forward(signum: int, frame: Any) -> None:
        # Ctrl-C reaches the ranks from the terminal as well: passed on as SIGTERM, so that
        # only the terminal's second Ctrl-C is a rank's second
        sent = signal.SIGTERM if signum == signal.SIGINT else signum
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, sent)

    if threading.current_thread() is threading.main_thread():
        for sig in {signal.SIGINT, signal.SIGTERM, preempt_signal()}:
            forwarded[sig] = signal.signal(sig, forward)
    try:
        for p in procs:
            p.start()
        failed = _wait(procs, cfg.trainer.heartbeat_s + 10)
    finally:
        for sig, handler in forwarded.items():
            signal.signal(sig, handler)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    if failed is None:
        return read_metrics(run_dir)
    rank, code = failed
    if code < 0:
        raise RunFault(f"rank {rank} of {size} was killed by signal {signal.Signals(-code).name}")
    if code > 128 and all((p.exitcode or 0) > 128 for p in procs):
        raise SystemExit(code)  # stopped by a signal at a step boundary, state saved
    if code == 2:
        raise ConfigError(f"rank {rank} of {size} refused the run (its sentence is above).")
    raise RunFault(f"rank {rank} of {size} failed with exit code {code} (its sentence is above)")


def _wait(procs: list, grace_s: float) -> tuple[int, int] | None:
    """Wait for every rank; (rank, exit code) of the first that failed, or None."""
    pending = dict(enumerate(procs))
    failed, deadline = None, None
    while pending:
        wait([p.sentinel for p in pending.values()], 0.5)
        for rank, p in list(pending.items()):
            if p.exitcode is not None:
                del pending[rank]
                if p.exitcode != 0 and failed is None:
                    failed, deadline = (rank, p.exitcode), time.monotonic() + grace_s
        if deadline is not None and time.monotonic() > deadline:
            for p in pending.values():
                p.kill()
                p.join(5)
            break
    return failed

"""Checkpoints written during a run, and the stop signals that wait for a step boundary.

`save` writes the state a resumed run starts from (zkl/state/resume.py reads it back) in
`run_dir/checkpoint.pt`, atomically; `restore` loads it into the policy.
Ctrl-C (SIGINT), SIGTERM and submitit's preemption signal (USR2; Slurm sends it before the
time limit) wait for the end of the current step: the step finishes and is logged, the state
is saved whatever `checkpoint.every` says, then the signal's earlier handler runs
(submitit's calls the launcher's `checkpoint` hook and requeues the job) or the run exits
(130 for Ctrl-C, 128 + the signal's number otherwise) with a line saying where it can be
resumed from. A second Ctrl-C stops at once: the step in flight is abandoned (none of it is
logged or saved; the steps before it stay as they were), except during a save, which
finishes first.
`cfg` is the run's `zkl.run.schema.ZklConfig`, taken duck-typed (the schema composes the
parts, this one among them): `checkpoint.*`, `rl.steps`, and the whole of it saved as a dict.
"""

from __future__ import annotations

import contextlib
import random
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zkl import environment
from zkl.console import say
from zkl.distributed import ranks
from zkl.errors import RunFault
from zkl.state import checkpoint_file
from zkl.state import sharded as sharded_checkpoint
from zkl.state.config import CHECKPOINT_FILE
from zkl.state.requeue import cap_reached
from zkl.state.resume import Resume, config_dict


def restore(resume: Resume, policy) -> None:
    """Load the saved policy and RNG states (nothing for a fresh run)."""
    if resume.state is None:
        return
    if "shards" in resume.state:  # a sharded run's (zkl/state/sharded.py)
        sharded_checkpoint.restore(resume, policy, resume.run_dir)
        return
    policy.load_state_dict(resume.state["policy"])
    rng = resume.state["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def save(run_dir: str | Path, cfg: Any, policy, next_step: int, log, requeue: bool) -> None:
    """Write the state before `next_step` atomically, with its digest (state/checkpoint_file.py)."""
    if policy.world.sharded:  # every rank writes its shards (a collective)
        return sharded_checkpoint.save(run_dir, cfg, policy, next_step, log, requeue)
    rng = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
    }
    state = {
        "step": next_step,
        "policy": policy.state_dict(),
        "rng": rng,
        "wandb_id": log.wandb_id,
        "config": config_dict(cfg),
        "requeue": requeue,
    }
    checkpoint_file.write(Path(run_dir) / CHECKPOINT_FILE, state)


class StopSignals:
    """Holds Ctrl-C, SIGTERM and the preemption signal until `act()` at a step boundary.

    A second Ctrl-C raises KeyboardInterrupt at once, unless `saving`. `announce(signum)` is
    told of the first signal (the line that says the step will finish).
    """

    def __init__(self, announce: Callable[[int], None] | None = None) -> None:
        self.received: list[int] = []
        self.previous: dict[int, Any] = {}
        self.refused: Exception | None = None  # why the launcher's handler did not requeue
        self.refused_at = 0  # the next step when it did not
        self.saving = False  # a checkpoint is being written: a second Ctrl-C waits for it
        self.announce = announce

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers live there only
            for sig in {signal.SIGINT, signal.SIGTERM, environment.preempt_signal()}:
                self.previous[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and signal.SIGINT in self.received and not self.saving:
            raise KeyboardInterrupt
        first = not self.received
        self.received.append(signum)
        if first and self.announce is not None:
            self.announce(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    @property
    def preempted(self) -> bool:
        return environment.preempt_signal() in self.received

    def first(self) -> int:
        """The signal the run stops for: the preemption signal, else Ctrl-C (a sharded run's
        ranks get it from the terminal and as SIGTERM from their spawner), else the first; a
        rank of a sharded run may stop on another rank's, as SIGTERM."""
        if self.preempted:
            return environment.preempt_signal()
        if signal.SIGINT in self.received:
            return signal.SIGINT
        return (self.received or [signal.SIGTERM])[0]

    def act(self) -> None:
        """Hand the signal to its earlier handler (submitit's requeues), else exit."""
        sig = self.first()
        handler = self.previous.get(sig)
        self.__exit__()
        if callable(handler) and handler is not signal.default_int_handler:
            if self.preempted:
                # submitit's handler requeues the job, and Slurm then SIGTERMs this process at
                # once: ignored, so the handler's own exit ends it. Killed by that SIGTERM
                # instead, the attempt was seen as FAILED in a race with the requeue, and the
                # launcher gave the run up.
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                handler(sig, None)
            except Exception as err:  # submitit gave up: too many time-outs, not requeued
                self.refused = err
                raise
        raise SystemExit(128 + sig)


def _logged(count: int) -> str:
    """`step 0 is` / `steps 0-2 are` (`count` >= 1 steps from step 0)."""
    return "step 0 is" if count == 1 else f"steps 0-{count - 1} are"


def standing(cfg: Any, run_dir: str | Path, logged: int, saved: int) -> str:
    """Where a stopped run stands: steps before `logged` logged, the checkpoint's steps before
    `saved` (0: none), and what `resume=true` makes of that."""
    again = f"resume=true hydra.run.dir={run_dir}"
    if logged and saved == logged:
        return f"{_logged(logged)} logged and saved: {again} continues from step {saved}"
    done = f"{_logged(logged)} logged" if logged else "no step is logged"
    if saved:
        return (
            f"{done}, {_logged(saved)} saved in {CHECKPOINT_FILE}: {again} continues from "
            f"step {saved} (the later rows are dropped and run again)"
        )
    if not cfg.checkpoint.save:
        return f"{done} and checkpoint.save=false saves none: nothing can be resumed"
    if not logged:
        return f"{done} and no {CHECKPOINT_FILE} is saved: nothing can be resumed"
    return (
        f"{done} but no {CHECKPOINT_FILE} is saved (checkpoint.every={cfg.checkpoint.every}): "
        f"nothing can be resumed, and {again} starts again from step 0"
    )


def _teardown_wandb() -> None:
    """Stop the W&B service before Slurm's requeue SIGTERM kills it mid-connection."""
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        with contextlib.suppress(Exception):  # the service may be gone; the run is saved
            wandb.teardown()


class Saver:
    """Saves every `checkpoint.every` steps, after the last step and when a stop signal came.

    `start`: the step the run starts at, which the checkpoint on disk (if any) continues from.
    `world`: this process's rank of the run; rank 0 announces a signal, and every rank stops
    when any got one.
    """

    def __init__(
        self,
        cfg: Any,
        run_dir: str | Path,
        policy,
        log,
        start: int = 0,
        world: ranks.World | None = None,
    ):
        self.cfg, self.run_dir, self.policy, self.log = cfg, run_dir, policy, log
        self.world = world if world is not None else ranks.World()
        self.logged = self.saved = start  # steps before `logged` logged, before `saved` saved
        self.between = True  # no step in flight (before the first, or at a boundary)
        self.main = self.world.is_main
        self.signals = StopSignals(self._announce if self.main else None)

    def _announce(self, signum: int) -> None:
        name = signal.Signals(signum).name
        then = "saving and stopping" if self.cfg.checkpoint.save else "stopping"
        again = " (Ctrl-C again stops at once, without it)" if signum == signal.SIGINT else ""
        with contextlib.suppress(RuntimeError):  # stderr busy in this thread: the line is lost
            say(f"zkl: {name}: finishing step {self.logged}, then {then}{again}.")

    def __enter__(self) -> Saver:
        self.signals.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.signals.__exit__()
        if self.signals.refused is not None:
            next_step = self.signals.refused_at
            raise RunFault(
                cap_reached(self.signals.refused, str(self.run_dir), next_step, self.cfg.rl.steps)
            ) from None
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            lost = "" if self.between else f"step {self.logged} is abandoned; "
            where = standing(self.cfg, self.run_dir, self.logged, self.saved)
            raise KeyboardInterrupt(f"{lost}{where}") from None
        if self.signals.received and exc_type is not None and issubclass(exc_type, Exception):
            # The run was being stopped (Slurm signals every process of the job, and the
            # generator's or W&B's may die first): exit as stopped, not as failed, so that
            # a requeued job is not reported failed. The last checkpoint stands.
            say(f"zkl: stopping; the step in flight failed: {exc!r}")
            raise SystemExit(128 + self.signals.first()) from exc

    def before_step(self) -> None:
        """Call as a step starts: an interrupt from here on abandons it."""
        self.between = False

    def after_step(self, step: int) -> None:
        """Call once the step is logged: save if it is time, then act on a stop signal."""
        self.logged, self.between = step + 1, True
        every, last = self.cfg.checkpoint.every, step + 1 == self.cfg.rl.steps
        stop = self.world.any(bool(self.signals.received)) and not last  # all ranks
        due = last or stop or (every and (step + 1) % every == 0)
        if due and self.cfg.checkpoint.save:
            requeue = stop and self.signals.preempted
            self.signals.saving = True
            try:
                save(self.run_dir, self.cfg, self.policy, step + 1, self.log, requeue)
            finally:
                self.signals.saving = False
            self.saved = step + 1
        if stop:
            self.log.close()  # W&B finished before a requeue, not torn down under it
            _teardown_wandb()
            self.signals.refused_at = step + 1
            if self.main and not self.signals.preempted:
                name = signal.Signals(self.signals.first()).name
                where = standing(self.cfg, self.run_dir, step + 1, self.saved)
                say(f"zkl: stopped by {name}; {where}.")
            self.signals.act()

"""Checkpoint and resume: a run's state at a step boundary, so a resumed run is bitwise the same.

Rollouts are a function of (seed, step, weights): requests are seeded from (seed, step, index).
So the state is the policy (weights, fp32 masters, AdamW), the weight version, the RNG
states, the next step and the W&B run id, in `run_dir/checkpoint.pt`, written atomically.
With `kv_invalidate_on_refit` and `quantized_weight_refresh` on, the engine keeps nothing
across a refit that a later step can see, so it needs no saving; with either off it reuses
state computed with older weights, which is not saved, and such a run refuses to resume.

SIGTERM and submitit's preemption signal (USR2; Slurm sends it before the time limit) wait
for the end of the current step: the step is logged, the state saved, then the signal's
earlier handler runs (submitit's calls the launcher's `checkpoint` hook and requeues the job)
or the run exits. A requeued job (`SLURM_RESTART_COUNT` > 0, or a submitit job restarted
after such a signal) resumes by itself; by hand it is `python -m zkl ... resume=true`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from zkl import checkpoint_file, distributed, environment, invariance
from zkl.config import ConfigError, ZklConfig
from zkl.tracking.run_log import METRICS_FILE, TOKENS_FILE, flatten

CHECKPOINT_FILE = "checkpoint.pt"
# Keys a resumed run may change: none of them changes a logged number.
MAY_CHANGE = ("resume", "rl.steps", "checkpoint.", "tracking.progress", "tracking.wandb.")


def preempt_signal() -> signal.Signals:
    """The signal submitit turns into checkpoint-and-requeue (`SUBMITIT_PREEMPT_SIGNAL`)."""
    return environment.preempt_signal()


def config_dict(cfg: ZklConfig) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def _check_same_config(cfg: ZklConfig, saved: dict[str, Any]) -> None:
    now, then = flatten(config_dict(cfg)), flatten(saved)
    for key in sorted(set(now) | set(then)):
        if key.startswith(MAY_CHANGE) or now.get(key) == then.get(key):
            continue
        raise ConfigError(
            f"resuming needs the config the run started with: {key} was {then.get(key)!r}, "
            f"now {now.get(key)!r}."
        )


def _check_engine_state_free(cfg: ZklConfig) -> None:
    """Refuse a resume that could not be bitwise: the engine's stale state is not saved."""
    fixes = invariance.resolve(cfg.zero_train_gen_mismatch, vars(cfg.fixes))
    if cfg.kv.mode == "persist" and "kv_invalidate_on_refit" not in fixes:
        raise ConfigError(
            "a kv=persist run without fix kv_invalidate_on_refit cannot resume bitwise "
            "(its stale prefix cache is not checkpointed); rerun it from step 0."
        )
    if cfg.precision.linear_quant != "none" and "quantized_weight_refresh" not in fixes:
        raise ConfigError(
            "a quantized run without fix quantized_weight_refresh cannot resume bitwise "
            "(its stale quantized weights are not checkpointed); rerun it from step 0."
        )


@dataclass
class LogScan:
    """What a resume keeps of a .jsonl log: the complete lines of steps before its checkpoint."""

    path: Path
    kept: list[tuple[int, str]]  # (step, line), in file order
    changed: bool  # some line is dropped: the file is rewritten
    notes: list[str]  # what was dropped, for the one line a resume prints
    damaged: list[int]  # line numbers that are not a row with a step

    def steps(self) -> set[int]:
        return {step for step, _ in self.kept}

    def write(self) -> None:
        if not self.changed:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line for _, line in self.kept))
        os.replace(tmp, self.path)
        print(f"zkl: {self.path}: dropped {', '.join(self.notes)}", file=sys.stderr)


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if type(step) is int and step >= 0 else None


def scan_jsonl(path: Path, next_step: int, one_per_step: bool) -> LogScan:
    """Read `path` without trusting it: blank, torn, non-JSON and step-less lines are dropped,
    so are exact repeats and steps from `next_step` on. Two different rows for one step of a
    one-row-per-step log (two writers) are a ConfigError: which one is true is unknown."""
    text = path.read_bytes().decode("utf-8", "replace") if path.is_file() else ""
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    kept: list[tuple[int, str]] = []
    seen: dict[int, tuple[int, str]] = {}
    lines_seen: set[str] = set()
    blank = repeats = later = 0
    damaged: list[int] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            blank += 1
            continue
        step = _step_of(line)
        if step is None:
            damaged.append(number)
        elif step >= next_step:
            later += 1
        elif line in lines_seen:
            repeats += 1
        elif one_per_step and step in seen:
            raise ConfigError(
                f"{path} holds two different rows for step {step} (lines {seen[step][0]} and "
                f"{number}), as when two runs wrote one directory; start afresh in another "
                "hydra.run.dir."
            )
        else:
            lines_seen.add(line)
            seen[step] = (number, line)
            kept.append((step, line + "\n"))
    counts = [
        (blank, "blank line"),
        (repeats, "repeated row"),
        (later, f"row of step {next_step} or later"),
    ]
    notes = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in counts if n]
    if damaged:
        notes.append(f"line{'s' if len(damaged) > 1 else ''} {_numbers(damaged)} (not a row)")
    if torn:
        notes.append("a torn last line")
    return LogScan(path, kept, bool(notes), notes, damaged)


def _numbers(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:5]))
    return shown + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")


def trim_logs(run_dir: Path, next_step: int) -> None:
    """Cut metrics.jsonl and tokens.jsonl back to the steps before `next_step`, or refuse.

    A step's metrics row is its commit record (zkl/tracking/run_log.py writes the token
    records first), so token records of a step without a row are dropped. A step before
    `next_step` without a complete row is refused: the checkpoint's history is not on disk.
    """
    metrics = scan_jsonl(run_dir / METRICS_FILE, next_step, one_per_step=True)
    absent = sorted(set(range(next_step)) - metrics.steps())
    if absent:
        why = f" (line {_numbers(metrics.damaged)} is not a row)" if metrics.damaged else ""
        raise ConfigError(
            f"{metrics.path} has no complete row for step {absent[0]}{why}, but "
            f"{run_dir / CHECKPOINT_FILE} is at step {next_step}; delete the checkpoint to "
            "rerun from step 0 with resume=true, or start afresh in another hydra.run.dir."
        )
    tokens = scan_jsonl(run_dir / TOKENS_FILE, next_step, one_per_step=False)
    metrics.kept.sort(key=lambda kept: kept[0])  # stable: file order within a step
    metrics.changed |= [s for s, _ in metrics.kept] != sorted(s for s, _ in metrics.kept)
    metrics.write()
    tokens.write()


def requeued_by_slurm() -> bool:
    return environment.restart_count() > 0


@dataclass
class Resume:
    """Where a run starts: step 0, or the checkpoint's step with its state."""

    step: int = 0
    state: dict[str, Any] | None = None
    wandb_id: str | None = None
    run_dir: str | None = None

    def restore(self, policy) -> None:
        """Load the saved policy and RNG states (nothing for a fresh run)."""
        if self.state is None:
            return
        if "shards" in self.state:  # a sharded run's (zkl/distributed/checkpoint.py)
            from zkl.distributed.checkpoint import restore

            restore(self, policy, self.run_dir)
            return
        policy.load_state_dict(self.state["policy"])
        rng = self.state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])


def prepare(cfg: ZklConfig, run_dir: str | Path) -> Resume:
    """Decide how the run in `run_dir` starts; trim its logs to the checkpoint when resuming.

    Refuses (ConfigError, one sentence) a fresh run into a directory that already holds
    metrics, a resume with another config, and a resume that could not be bitwise.
    """
    if cfg.checkpoint.every < 0:
        raise ConfigError(
            f"checkpoint.every={cfg.checkpoint.every} must be >= 0 (0: only at "
            "the end and on a stop signal)."
        )
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT_FILE
    if cfg.checkpoint.save:
        _check_disk(cfg, run_dir)
    elif cfg.resume:
        raise ConfigError(
            "resume=true needs a checkpoint, but checkpoint.save=false writes none; "
            "set checkpoint.save=true (or drop resume=true for a fresh run)."
        )
    in_submitit = bool(os.environ.get("SUBMITIT_EXECUTOR"))
    maybe_resume = cfg.resume or in_submitit or requeued_by_slurm()
    load = maybe_resume and os.path.lexists(path)  # tensors land on the CPU, then the device
    state = checkpoint_file.read(path, cfg.rl.steps) if load else None
    restarted = requeued_by_slurm() or (in_submitit and state is not None and state["requeue"])
    if not (cfg.resume or restarted):
        metrics = run_dir / METRICS_FILE
        if metrics.is_file() and metrics.stat().st_size:  # not a file: the writer says why
            raise ConfigError(
                f"{run_dir} already holds {METRICS_FILE}: pass resume=true to continue that "
                "run, or choose another hydra.run.dir."
            )
        path.unlink(missing_ok=True)  # a stale checkpoint must never meet these new metrics
        return Resume()
    if state is None:
        print(f"zkl: no {CHECKPOINT_FILE} in {run_dir}: starting from step 0", file=sys.stderr)
        trim_logs(run_dir, 0)
        return Resume()
    _check_same_config(cfg, state["config"])
    _check_engine_state_free(cfg)
    step = state["step"]
    trim_logs(run_dir, step)
    print(f"zkl: resuming {run_dir} from step {step}", file=sys.stderr)
    return Resume(step, state, state["wandb_id"], str(run_dir))


def checkpoint_bytes(cfg: ZklConfig) -> int:
    """The size of checkpoint.pt: bf16 weights, fp32 masters and two AdamW moments a parameter."""
    from zkl.memory import param_count

    return 14 * param_count(cfg.model)


def size_text(num_bytes: float) -> str:
    """`num_bytes` in the largest unit that keeps it at 1 or more: 512 B, 3.4 MB, 1.2 TB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    raise AssertionError


def _check_disk(cfg: ZklConfig, run_dir: Path) -> None:
    """Refuse, before any work, a run whose checkpoints would fill the run directory's disk.

    A checkpoint is written beside the one it replaces (temporary file, then rename), so a
    run that saves more than once needs room for two, unless one is already on the disk.
    """
    need = checkpoint_bytes(cfg)
    if 0 < cfg.checkpoint.every < cfg.rl.steps and not (run_dir / CHECKPOINT_FILE).exists():
        need *= 2
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need > free:
        raise ConfigError(
            f"the checkpoints of this run need about {size_text(need)} but {probe} has "
            f"{size_text(free)} free; set checkpoint.save=false, or choose a "
            "hydra.run.dir on a larger disk."
        )


def save(run_dir: str | Path, cfg: ZklConfig, policy, next_step: int, log, requeue: bool) -> None:
    """Write the state before `next_step` atomically, with its digest (zkl/checkpoint_file.py)."""
    if policy.world.sharded:  # every rank writes its shards (a collective)
        from zkl.distributed.checkpoint import save as save_sharded

        return save_sharded(run_dir, cfg, policy, next_step, log, requeue)
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
    """Holds SIGTERM and the preemption signal until `act()` at a step boundary."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.previous: dict[int, Any] = {}
        self.refused: Exception | None = None  # why the launcher's handler did not requeue
        self.refused_at = 0  # the next step when it did not

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers live there only
            for sig in {signal.SIGTERM, preempt_signal()}:
                self.previous[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.received.append(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    @property
    def preempted(self) -> bool:
        return preempt_signal() in self.received

    def act(self) -> None:
        """Hand the signal to its earlier handler (submitit's requeues), else exit."""
        # a rank of a sharded run may stop on another rank's signal
        sig = preempt_signal() if self.preempted else (self.received or [signal.SIGTERM])[0]
        handler = self.previous.get(sig)
        self.__exit__()
        if callable(handler):
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


def _teardown_wandb() -> None:
    """Stop the W&B service before Slurm's requeue SIGTERM kills it mid-connection."""
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        with contextlib.suppress(Exception):  # the service may be gone; the run is saved
            wandb.teardown()


class Saver:
    """Saves every `checkpoint.every` steps, after the last step and when a stop signal came."""

    def __init__(self, cfg: ZklConfig, run_dir: str | Path, policy, log):
        self.cfg, self.run_dir, self.policy, self.log = cfg, run_dir, policy, log
        self.signals = StopSignals()

    def __enter__(self) -> Saver:
        self.signals.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.signals.__exit__()
        if self.signals.refused is not None:
            from zkl.errors import RunFault
            from zkl.requeue import cap_reached

            next_step = self.signals.refused_at
            raise RunFault(
                cap_reached(self.signals.refused, str(self.run_dir), next_step, self.cfg.rl.steps)
            ) from None
        if self.signals.received and exc_type is not None and issubclass(exc_type, Exception):
            # The run was being stopped (Slurm signals every process of the job, and the
            # generator's or W&B's may die first): exit as stopped, not as failed, so that
            # a requeued job is not reported failed. The last checkpoint stands.
            print(f"zkl: stopping; the step in flight failed: {exc!r}", file=sys.stderr)
            raise SystemExit(128 + self.signals.received[0]) from exc

    def after_step(self, step: int) -> None:
        """Call once the step is logged: save if it is time, then act on a stop signal."""
        every, last = self.cfg.checkpoint.every, step + 1 == self.cfg.rl.steps
        stop = distributed.current().any(bool(self.signals.received)) and not last  # all ranks
        due = last or stop or (every and (step + 1) % every == 0)
        if due and self.cfg.checkpoint.save:
            requeue = stop and self.signals.preempted
            save(self.run_dir, self.cfg, self.policy, step + 1, self.log, requeue)
        if stop:
            self.log.close()  # W&B finished before a requeue, not torn down under it
            _teardown_wandb()
            self.signals.refused_at = step + 1
            self.signals.act()

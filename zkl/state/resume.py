"""Where a run starts: step 0, or its checkpoint's step with the state saved there.

Rollouts are a function of (seed, step, weights): requests are seeded from (seed, step, index).
So the state is the policy (weights, fp32 masters, AdamW), the weight version, the RNG
states, the next step and the W&B run id, in `run_dir/checkpoint.pt` (zkl/state/checkpoint.py
writes it). With `kv_invalidate_on_refit` and `quantized_weight_refresh` on, the scheduler
keeps nothing across a refit that a later step can see, so it needs no saving; with either
off it reuses state computed with older weights, which is not saved, and such a run refuses
to resume. A requeued job (`SLURM_RESTART_COUNT` > 0, or a submitit job restarted after a
preemption signal) resumes by itself; by hand it is `python -m zkl ... resume=true`.
`cfg` is the run's `zkl.run.schema.ZklConfig`, taken duck-typed (the schema composes the
parts, this one among them): the whole of it is compared with the saved one.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zkl import environment, invariance
from zkl.console import say
from zkl.errors import ConfigError, ForeignRunDir
from zkl.memory import param_count
from zkl.state import checkpoint_file
from zkl.state.config import CHECKPOINT_FILE
from zkl.state.resume_logs import trim_logs
from zkl.state.same_config import first_difference
from zkl.tracking.run_log import METRICS_FILE


def config_dict(cfg: Any) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def _check_same_config(cfg: Any, saved: dict[str, Any]) -> None:
    difference = first_difference(config_dict(cfg), saved)
    if difference is not None:
        key, then, now = difference
        raise ConfigError(
            f"resuming needs the config the run started with: {key} was {then!r}, now {now!r}."
        )


def _check_scheduler_state_free(cfg: Any) -> None:
    """Refuse a resume that could not be bitwise: the state a fix that is off leaves in the
    scheduler across refits (its entry's `stale`) is not saved."""
    fixes = invariance.from_config(cfg)
    for fix in invariance.FIXES.values():
        stale = fix.stale
        if stale is None or fix.name in fixes:
            continue
        value = functools.reduce(getattr, stale.key.split("."), cfg)
        if value != stale.free:
            raise ConfigError(
                f"a {stale.key}={value} run without fix {fix.name} cannot resume bitwise "
                f"(its {stale.what} is not checkpointed); rerun it from step 0."
            )


def requeued_by_slurm() -> bool:
    return environment.restart_count() > 0


@dataclass
class Resume:
    """Where a run starts: step 0, or the checkpoint's step with its state."""

    step: int = 0
    state: dict[str, Any] | None = None
    wandb_id: str | None = None
    run_dir: str | None = None


def prepare(cfg: Any, run_dir: str | Path) -> Resume:
    """Decide how the run in `run_dir` starts; trim its logs to the checkpoint when resuming.

    Refuses (ConfigError, one sentence) a fresh run into a directory that already holds
    metrics, a resume with another config, and a resume that could not be bitwise.
    """
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT_FILE
    if cfg.checkpoint.save:
        _check_disk(cfg, run_dir)
    in_submitit = bool(os.environ.get("SUBMITIT_EXECUTOR"))
    maybe_resume = cfg.resume or in_submitit or requeued_by_slurm()
    load = maybe_resume and os.path.lexists(path)  # tensors land on the CPU, then the device
    state = checkpoint_file.read(path, cfg.rl.steps) if load else None
    restarted = requeued_by_slurm() or (in_submitit and state is not None and state["requeue"])
    if not (cfg.resume or restarted):
        metrics = run_dir / METRICS_FILE
        if metrics.is_file() and metrics.stat().st_size:  # not a file: the writer says why
            raise ForeignRunDir(
                f"{run_dir} already holds {METRICS_FILE}: pass resume=true to continue that "
                "run, or choose another hydra.run.dir."
            )
        path.unlink(missing_ok=True)  # a stale checkpoint must never meet these new metrics
        return Resume()
    if state is None:
        say(f"zkl: no {CHECKPOINT_FILE} in {run_dir}: starting from step 0")
        trim_logs(run_dir, 0)
        return Resume()
    _check_same_config(cfg, state["config"])
    _check_scheduler_state_free(cfg)
    step = state["step"]
    trim_logs(run_dir, step)
    say(f"zkl: resuming {run_dir} from step {step}")
    return Resume(step, state, state["wandb_id"], str(run_dir))


def checkpoint_bytes(cfg: Any) -> int:
    """The size of checkpoint.pt: bf16 weights, fp32 masters and two AdamW moments a parameter."""
    return 14 * param_count(cfg.model)


def size_text(num_bytes: float) -> str:
    """`num_bytes` in the largest unit that keeps it at 1 or more: 512 B, 3.4 MB, 1.2 TB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    raise AssertionError


def _check_disk(cfg: Any, run_dir: Path) -> None:
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

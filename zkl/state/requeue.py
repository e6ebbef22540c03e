"""Slurm's time limit and submitit's requeue cap, said at submission and when the cap is hit.

submitit requeues a job that reaches its time limit at most `max_num_timeout` times, so a run
longer than (max_num_timeout + 1) x timeout_min cannot finish. The sweep says that limit as
it submits; a run that hits it stops with a sentence (and error.txt) naming the keys to raise.
"""

from __future__ import annotations

from typing import Any


def submission_note(config: Any) -> str | None:
    """The sentence a Slurm multirun prints as it submits: how long a job may run in all."""
    launcher = config.hydra.get("launcher") or {}
    if "Slurm" not in str(launcher.get("_target_", "")):
        return None
    minutes = int(launcher.get("timeout_min") or 0)
    requeues = int(launcher.get("max_num_timeout") or 0)
    total = minutes * (requeues + 1)
    return (
        f"each job may run {total / 60:.4g} hours in all: {requeues + 1} attempts of "
        f"hydra.launcher.timeout_min={minutes} minutes "
        f"(hydra.launcher.max_num_timeout={requeues} requeues); a run that needs longer stops "
        "with error.txt saying so, so raise either key for a longer run."
    )


def cap_reached(reason: BaseException, run_dir: str, next_step: int, steps: int) -> str:
    """The sentence for a run submitit will not requeue again (its checkpoint is saved)."""
    return (
        f"the run reached its time limit and submitit did not requeue it ({reason}); steps "
        f"0-{next_step - 1} of {steps} are logged and checkpointed in {run_dir}: raise "
        "hydra.launcher.max_num_timeout or hydra.launcher.timeout_min, or continue it with "
        f"resume=true hydra.run.dir={run_dir}."
    )

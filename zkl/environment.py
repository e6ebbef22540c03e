"""The environment variables a run reads, each checked into one sentence before any work.

`SUBMITIT_PREEMPT_SIGNAL` (the signal submitit checkpoints and requeues on; `USR2` and
`SIGUSR2` alike), `SLURM_RESTART_COUNT` (set by Slurm on a requeued job), and, for a run with
W&B on, every `WANDB_*` variable W&B itself parses (`WANDB_MODE`, `WANDB_SILENT`, ...): W&B
rejects a bad one with a pydantic traceback in the middle of start-up.
"""

from __future__ import annotations

import os
import signal

from zkl.errors import ConfigError

PREEMPT_SIGNAL = "SUBMITIT_PREEMPT_SIGNAL"
RESTART_COUNT = "SLURM_RESTART_COUNT"


def preempt_signal() -> signal.Signals:
    """The signal submitit turns into checkpoint-and-requeue (default USR2)."""
    raw = os.environ.get(PREEMPT_SIGNAL, "USR2")
    name = raw.strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    sig = getattr(signal.Signals, name, None) if name.isidentifier() else None
    if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ConfigError(
            f"{PREEMPT_SIGNAL}={raw!r} is not a signal a run can catch; set it to a signal "
            "name such as USR2 (or SIGUSR2), or unset it."
        )
    return sig


def restart_count() -> int:
    """How often Slurm requeued this job (0 outside Slurm)."""
    raw = os.environ.get(RESTART_COUNT) or "0"
    if not (raw.isascii() and raw.isdigit()):
        raise ConfigError(
            f"{RESTART_COUNT}={raw!r} is not a count of restarts (Slurm sets a whole number "
            ">= 0); unset it outside a Slurm job."
        )
    return int(raw)


def check_wandb() -> None:
    """Each `WANDB_*` variable as W&B's own settings parse it, so a bad value is one sentence."""
    from pydantic import ValidationError
    from wandb.sdk.wandb_settings import Settings

    settings = Settings()
    for name, value in sorted(os.environ.items()):
        if not name.startswith("WANDB_"):
            continue
        try:
            settings.update_from_env_vars({name: value})
        except (ValidationError, ValueError, TypeError) as err:
            errors = err.errors() if isinstance(err, ValidationError) else []
            why = errors[0]["msg"] if errors else str(err).splitlines()[0]
            raise ConfigError(
                f"{name}={value!r} is refused by W&B ({why}); fix or unset {name}, or set "
                "tracking.wandb.mode=disabled."
            ) from None


def check(wandb_on: bool) -> None:
    """Every variable a run will read; call before any work."""
    preempt_signal()
    restart_count()
    if wandb_on:
        check_wandb()

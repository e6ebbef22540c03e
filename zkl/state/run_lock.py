"""One run a directory: an exclusive `flock` on `run_dir/.zkl.lock`, held while the run lives.

Two processes writing one run directory interleave their metrics and token records and save
through the same temporary checkpoint name (a job submitted twice, a Slurm requeue beside an
attempt that still runs). The kernel drops an `flock` when its holder exits, however it
exits, so the lock file a killed run leaves behind blocks nothing: a requeue after a crash
starts. The holder writes its PID into the file, so a refused run can name it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from zkl.errors import ConfigError, ForeignRunDir

LOCK_FILE = ".zkl.lock"


class RunDirInUse(ForeignRunDir):
    """Another live process holds the run directory: nothing of it may be written."""


_held: dict[str, list[int]] = {}  # resolved run dir -> [fd, depth]: re-entrant in a process


def _holder(fd: int) -> str:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"


def acquire(run_dir: str | Path, key: str = "hydra.run.dir") -> None:
    """Take the lock of `run_dir` (created if missing) or raise ConfigError naming its holder."""
    run_dir = Path(run_dir)
    name = str(run_dir.resolve())
    if name in _held:
        _held[name][1] += 1
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ConfigError(
            f"{key}={run_dir} cannot be written ({err.strerror or err}); choose another {key}."
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = _holder(fd)
        os.close(fd)
        raise RunDirInUse(
            f"{key}={run_dir} is in use by another zkl run (PID {pid}); wait for it to end, "
            f"or choose another {key}."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[name] = [fd, 1]


def in_use(run_dir: str | Path) -> bool:
    """Whether another live process holds `run_dir`'s lock (creates nothing)."""
    if str(Path(run_dir).resolve()) in _held:
        return False
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def release(run_dir: str | Path) -> None:
    """Drop one hold; the last one unlocks (process exit unlocks in any case)."""
    name = str(Path(run_dir).resolve())
    entry = _held.get(name)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[name]
        os.close(entry[0])  # closing the only descriptor drops the flock


@contextlib.contextmanager
def held(run_dir: str | Path, key: str = "hydra.run.dir") -> Iterator[None]:
    """The lock of `run_dir` for the body; a refusal comes before the body does anything."""
    acquire(run_dir, key)
    try:
        yield
    finally:
        release(run_dir)

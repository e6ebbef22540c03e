"""Why a run stopped, in one sentence in `run_dir/error.txt`, for the comparison report.

A sweep's failed job leaves its run directory behind; the report shows this sentence beside
the run instead of leaving the user to dig through the launcher's logs.
"""

from __future__ import annotations

from pathlib import Path

from zkl.errors import ConfigError

ERROR_FILE = "error.txt"


def describe(err: BaseException) -> str:
    """One line: a ConfigError's own sentence, else the exception's type and first line."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if isinstance(err, ConfigError):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def record_error(run_dir: str | Path, err: BaseException) -> str:
    line = describe(err)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / ERROR_FILE).write_text(line + "\n")
    return line


def clear_error(run_dir: str | Path) -> None:
    (Path(run_dir) / ERROR_FILE).unlink(missing_ok=True)


def read_error(run_dir: str | Path) -> str | None:
    path = Path(run_dir) / ERROR_FILE
    return path.read_text().strip() if path.exists() else None

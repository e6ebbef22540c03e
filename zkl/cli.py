"""What every entry point does with a failure: one line on stderr and an exit code.

Exit 2: the config cannot work (`ConfigError`), found before any work, or a run directory
that cannot be written. A Hydra job that stops with a sentence (`job`) also leaves it in its
run directory's `error.txt`, for the report; a command line refused before Hydra starts
leaves no directory at all. Exit 1: the run started and a fault stopped it (`RunFault`: the
generation process died, the disk filled). Exit 130: Ctrl-C, with what is logged and what can
be resumed; inside a run's steps Ctrl-C (as SIGTERM) first finishes the step and saves, a
second one stops at once (zkl/state/checkpoint.py). The Hydra callback `RunDirCheck`
(conf/config.yaml) tests the run directory before Hydra writes into it, so an unwritable one
is a sentence, not Hydra's traceback (so is a Slurm launcher without Slurm: zkl/launchers.py),
and points `resume=true` without a folder of its own at the latest run of the same config
(zkl/state/latest_run.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict, read_write

from zkl.console import say
from zkl.errors import ConfigError, ForeignRunDir, RunFault
from zkl.help import help_text
from zkl.launchers import slurm_problem
from zkl.renamed import new_name
from zkl.run import overrides
from zkl.run.register import register
from zkl.run.schema import ZklConfig
from zkl.state import latest_run
from zkl.state.requeue import submission_note
from zkl.tracking.errors import clear_error, record_error

MIN_FREE_BYTES = 1 << 20  # a run directory on a disk with less free space is refused


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


class JobFailed(RuntimeError):
    """A multirun job's failure, its sentence already printed; the sweep goes on without it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple:  # a submitit job hands it back pickled
        return (JobFailed, (str(self), self.code))


def _fail(prog: str, message: str, code: int) -> None:
    """One line and an exit code; inside a multirun, fail this job alone (the sweep goes on)."""
    say(f"{prog}: {message}")
    if _in_multirun():
        raise JobFailed(f"{prog}: {message}", code) from None
    sys.exit(code)


def _old_key(err: BaseException) -> str | None:
    """The old name of a key (`zkl.renamed`) that Hydra's composition found in a file."""
    found = re.search(r"full_key: (\S+)", str(err))  # Hydra re-raises with the text only
    key = found.group(1) if found else None
    return key if key and new_name(key) else None


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def check_command_line(prog: str, schema: type = ZklConfig) -> argparse.Namespace:
    """`--help` answered and the overrides checked, before Hydra (and torch) loads.

    The command line is checked by `zkl.run.overrides.preflight` (unreadable overrides,
    unknown keys and group options with the nearest valid one, groups given twice, values of
    the wrong type); `--help` prints zkl's help for `schema` (`zkl.help`). `sys.argv` is
    left normalized (`+group=option` as `group=option`, an old key as its new one, with a
    line saying so).
    """
    argv = sys.argv[1:]
    args, _ = get_args_parser().parse_known_args(argv)
    if args.help:
        print(help_text(prog, schema))
        sys.exit(0)
    try:
        sys.argv[1:] = overrides.normalize(argv)
        overrides.preflight(overrides.normalize(args.overrides), args.config_dir, schema)
    except ConfigError as err:
        _fail(prog, str(err), 2)
    for sentence in overrides.renames(args.overrides):
        say(f"{prog}: {sentence}")
    return args


def hydra_entry(prog: str, hydra_main: Callable[[], None], schema: type = ZklConfig) -> None:
    """`check_command_line`, then `run_hydra`: an entry point whose module loads no torch."""
    check_command_line(prog, schema)
    run_hydra(prog, hydra_main, schema)


def run_hydra(prog: str, hydra_main: Callable[[], None], schema: type = ZklConfig) -> None:
    """Run a `@hydra.main` function, its command line already checked (`check_command_line`),
    with Hydra's own errors as one sentence each: `schema` is registered as the config's
    (`zkl.run.register`), and an error Hydra still raises (a bad config dir, a failed
    multirun job) ends in one line.
    """
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises, this function says it in one line
    register(schema)  # the schema and resolvers conf/ names, in Hydra before it composes
    try:
        hydra_main()
    except JobFailed as err:  # its sentence went out as the job failed
        sys.exit(err.code)
    except Exception as err:
        name = type(err).__name__
        module = type(err).__module__
        if module.startswith(("hydra", "omegaconf")):
            old = _old_key(err)
            if old is not None:  # a YAML file of the user's with a key's old name
                where = _first_line(err).split(":", 1)[0]
                say(f"{prog}: {where}: {old} is not a config key; it is now {new_name(old)}.")
                sys.exit(2)
            cause = f" ({_first_line(err.__cause__)})" if err.__cause__ is not None else ""
            say(f"{prog}: {_first_line(err)}{cause}")
            sys.exit(2)
        if name in ("FailedJobError", "UncompletedJobError"):  # submitit: a launched job failed
            say(
                f"{prog}: a launched job failed: {_first_line(err)} (its run directory's "
                "error.txt says why)."
            )
            sys.exit(1)
        raise


def guarded(prog: str, body: Callable[[], int | None]) -> None:
    """Run an entry point's body; turn its failures into one line and an exit code.

    A body that returns 0 or None returns normally (a multirun goes on to its next job).
    """
    try:
        code = body()
    except ConfigError as err:
        _fail(prog, str(err), 2)
    except RunFault as err:
        _fail(prog, str(err), 1)
    except KeyboardInterrupt as err:  # a run's loop says where it stands (zkl/state/checkpoint.py)
        say(f"{prog}: interrupted; {err or 'every step logged so far is complete'}.")
        sys.exit(130)
    else:
        if code:
            _fail(prog, f"exit code {code}", code)


def job(prog: str, body: Callable[[], int | None]) -> None:
    """A Hydra job's body, `guarded`; a failure's sentence also goes to the job's `error.txt`.

    A run refused before any work keeps the directory Hydra made for it (`.hydra/`), so it
    says why there, for the report. A directory that holds another run (a live one, or a
    finished one's metrics: `ForeignRunDir`) is that run's: its error.txt is left as it is.
    A run that ends well clears an earlier attempt's error.txt (a resumed run).
    """
    run_dir = HydraConfig.get().runtime.output_dir

    def recorded() -> int | None:
        try:
            code = body()
        except ForeignRunDir:
            raise
        except Exception as err:
            record_error(run_dir, err)
            raise
        if not code:
            clear_error(run_dir)
        return code

    guarded(prog, recorded)


def run_dir_problem(directory: str) -> str | None:
    """Why `directory` cannot hold a run, or None when it can (then it exists).

    A directory made here for a run that is refused is removed again: a refused run leaves
    no directory, or one with `error.txt`.
    """
    path = Path(directory)
    made = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
        stat = os.statvfs(path)
    except OSError as err:
        problem = f"cannot be written ({err.strerror or err})"
    else:
        if stat.f_bavail * stat.f_frsize >= MIN_FREE_BYTES:
            return None
        problem = "is on a full disk"
    if made:
        with contextlib.suppress(OSError):
            path.rmdir()
    return problem


def resume_latest(config: Any) -> None:
    """`resume=true` with a `hydra.run.dir` pattern (a fresh folder a run): point the run at the
    latest run of the same config (zkl/state/latest_run.py), or refuse in one sentence."""
    if not config.get("resume"):
        return
    pattern = OmegaConf.to_container(config.hydra.run)["dir"]  # uninterpolated
    if latest_run.folder_glob(str(pattern)) is None:  # a folder named: resumed as it is
        return
    job_config = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    try:
        found = latest_run.latest_run(str(pattern), job_config)
    except ConfigError as err:
        say(f"zkl: {err}")
        sys.exit(2)
    say(f"zkl: resume=true continues {found}, the latest run of this config.")
    with read_write(config):
        config.hydra.run.dir = str(found)


class RunDirCheck(Callback):
    """Refuse an unwritable `hydra.run.dir` (or `hydra.sweep.dir`) before Hydra writes in it;
    `resume=true` without a folder of its own finds the run to continue first."""

    def _check(self, directory: str, key: str) -> None:
        problem = run_dir_problem(directory)
        if problem:
            say(f"zkl: {key}={directory} {problem}; choose another {key}.")
            sys.exit(2)

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        resume_latest(config)
        self._check(str(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        problem = slurm_problem(config.hydra.get("launcher") or {})
        if problem:
            say(f"zkl: {problem}")
            sys.exit(2)
        self._check(str(config.hydra.sweep.dir), "hydra.sweep.dir")
        # A sweep file's `+precision: ...` works as on the command line (the sweeper is built
        # from this config after the callback).
        params = config.hydra.sweeper.get("params")
        if params:
            normalized, said = overrides.normalize_sweep_params(OmegaConf.to_container(params))
            for sentence in said:
                say(f"zkl: {sentence}")
            with read_write(config), open_dict(config):
                config.hydra.sweeper.params = normalized
        note = submission_note(config)
        if note:
            say(f"zkl: {note}")

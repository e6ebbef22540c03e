"""zkl's submitit launchers (`hydra/launcher=local|slurm|slurm_gpu`, conf/hydra/launcher):
each job's console lines come back to the sweep's console.

Hydra's basic launcher runs the jobs in its own process, so each job's last line (`N steps in
DIR: gen_kl_error ...`, a certificate's table) reaches the console. A submitit job runs
elsewhere and its stdout goes to its log under `.submitit/`; these launchers keep a copy of
what the job printed in the result submitit hands back, and print it, job by job, once the
sweep's jobs are done, with a failed job's one sentence (the one its error.txt holds). Hydra
instantiates launchers from the `hydra_plugins` package only, hence this package beside
`zkl`.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher import submitit_launcher  # the base launchers


class _Tee(io.TextIOBase):
    """Writes to the job's own stdout (its log) and keeps a copy."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:  # what reads the descriptor (W&B's console capture) gets the job's
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:
        return self.stream.encoding


class _EchoJobs:
    """A submitit launcher whose jobs' stdout is printed by the sweep's own process."""

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:  # runs inside the job
        tee = _Tee(sys.stdout)
        with contextlib.redirect_stdout(tee):
            ret = super().__call__(*args, **kwargs)
        ret.stdout = tee.copy.getvalue()  # pickled back with the result
        return ret

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """Every job's stdout, then a failed job's sentence (its error.txt), in job order."""
        returns = super().launch(job_overrides, initial_job_idx)
        for ret in returns:
            sys.stdout.write(getattr(ret, "stdout", ""))
            sys.stdout.flush()
            if ret.status == JobStatus.FAILED:
                print(ret._return_value, file=sys.stderr, flush=True)  # the job's sentence
        return returns


class LocalLauncher(_EchoJobs, submitit_launcher.LocalLauncher):
    """`hydra/launcher=local`: submitit_local, each job's lines printed here."""


class SlurmLauncher(_EchoJobs, submitit_launcher.SlurmLauncher):
    """`hydra/launcher=slurm|slurm_gpu`: submitit_slurm, each job's lines printed here."""

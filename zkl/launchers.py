"""Slurm without Slurm, as one sentence: a Slurm launcher on a machine without `srun`.

submitit's own error is a 40-line traceback ending `Could not detect "srun"`; the multirun's
callback (`zkl.cli.RunDirCheck`) asks `slurm_problem` before any job is submitted. The
launchers themselves, which bring each job's console lines back to the sweep's console, are a
Hydra plugin: `hydra_plugins/zkl_launchers` (Hydra instantiates launchers from that package
only).
"""

from __future__ import annotations

import shutil
from typing import Any


def slurm_problem(launcher: Any) -> str | None:
    """The sentence for a Slurm launcher where Slurm's `srun` is not on PATH, else None."""
    if "SlurmLauncher" not in str(launcher.get("_target_", "")):
        return None
    if shutil.which("srun") is not None:
        return None
    return (
        "hydra/launcher=slurm (and slurm_gpu) submits through Slurm, but this machine has no "
        "srun on PATH: run the sweep on a Slurm login node, use hydra/launcher=local (the same "
        "jobs in subprocesses here), or start a single-node cluster with "
        "scripts/slurm_local_cluster.sh."
    )

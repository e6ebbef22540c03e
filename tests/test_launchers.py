"""The submitit launchers (hydra_plugins/zkl_launchers, zkl/launchers.py): a Slurm launcher
without Slurm is one sentence before any work; a submitit sweep prints each job's result line
(and a failed job's sentence, not a traceback), as the basic launcher does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zkl.launchers import slurm_problem

REPO = Path(__file__).resolve().parent.parent
TINY = ["rl.steps=1", "rl.prompts_per_step=2", "rl.samples_per_prompt=2"]
QUIET = ["tracking.wandb.mode=disabled", "tracking.progress=false"]


def _sweep(tmp_path: Path, *overrides: str, path: str | None = None):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if path is not None:
        env["PATH"] = path
    cmd = [sys.executable, "-m", "zkl", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    cmd += [*QUIET, *TINY, *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("launcher", ["slurm", "slurm_gpu"])
def test_slurm_without_srun_is_one_sentence_before_any_work(launcher, tmp_path):
    """submitit's own answer is a 40-line traceback ending `Could not detect "srun"`."""
    python_only = tmp_path / "bin"  # a PATH with python and without Slurm, even on CI's machine
    python_only.mkdir()
    (python_only / "python").symlink_to(sys.executable)
    out = _sweep(tmp_path, f"hydra/launcher={launcher}", path=str(python_only))
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert lines[0].startswith("zkl: hydra/launcher=slurm (and slurm_gpu) submits through Slurm")
    assert "no srun on PATH" in lines[0] and "hydra/launcher=local" in lines[0]
    assert not (tmp_path / "sweep").exists()


def test_slurm_problem_asks_only_slurm_launchers(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert slurm_problem({"_target_": "hydra_plugins.zkl_launchers.SlurmLauncher"})
    assert slurm_problem({"_target_": "hydra_plugins.zkl_launchers.LocalLauncher"}) is None
    assert slurm_problem({}) is None  # the basic launcher
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert slurm_problem({"_target_": "hydra_plugins.zkl_launchers.SlurmLauncher"}) is None


@pytest.mark.slow
def test_local_launcher_prints_each_job_result_and_a_failed_job_sentence(tmp_path):
    """Job 0 runs, job 1 is refused (its prompt plus 500 tokens pass the model's positions):
    job 0's line on stdout, job 1's sentence on stderr, no traceback, the sweep's exit 2."""
    out = _sweep(tmp_path, "hydra/launcher=local", "sampling.max_new_tokens=6,500")
    assert out.returncode == 2, out.stderr[-3000:]
    sweep = tmp_path / "sweep"
    line = f"1 step in {sweep / '0'}: gen_kl_error exactly 0 at 1 of 1 step; reward first="
    assert [x for x in out.stdout.splitlines() if " step in " in x][0].startswith(line)
    sentence = (sweep / "1" / "error.txt").read_text().strip()
    assert f"zkl: {sentence}" in out.stderr.splitlines()
    assert "Traceback" not in out.stderr

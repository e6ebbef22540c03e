"""Sweeps on a real Slurm cluster through submitit (scripts/slurm_local_cluster.sh starts one).

Every test uses a fresh sweep directory: submitit keys its files by Slurm job id, and a
reused id could hand back a stale result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from html_tables import parse_tables

from tests.conftest import make_cfg
from zkl.report.tables import md_escape
from zkl.rl.loop import TIMING_PREFIXES, run
from zkl.state.config import CHECKPOINT_FILE

pytestmark = pytest.mark.slow  # whole experiments: `pytest -m "not slow"` skips them

REPO = Path(__file__).resolve().parent.parent
TINY = ["rl.prompts_per_step=2", "rl.samples_per_prompt=2", "tracking.progress=false"]
ONE_BED = ["model=tiny_dense", "+layout=colocated"]
ONE_ARM = "+arm=colocated"  # precision_matrix's zero-mode colocated arm alone
# slurmctld checks time limits (and sends their warning signal) every 30 s, so the USR2 of a
# 1-minute limit may come 31 s after the start: the job must run well past that. 200 steps
# took 20 s on a fast 2-core machine and the job finished unsignalled; 800 take over 60 s.
LONG = [*ONE_BED, "+precision=bf16", "kv=recompute", "rl.steps=800", "checkpoint.every=5"]
LONG += ["num_threads=1", *TINY]


def _cluster_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mixed", "alloc"))


if not _cluster_up():
    if os.environ.get("CI"):
        raise RuntimeError("CI needs the local Slurm cluster: scripts/slurm_local_cluster.sh")
    pytest.skip(
        "no Slurm cluster here: start one with `bash scripts/slurm_local_cluster.sh` (as root)",
        allow_module_level=True,
    )


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "WANDB_SILENT": "true", **extra}


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


def _script(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """scripts/run_zero_kl_precision.sh, as a user runs it, into `sweep_dir`."""
    env = _env(SWEEP_DIR=str(sweep_dir), WANDB_MODE="disabled", TIME_MIN="10")
    cmd = ["bash", str(REPO / "scripts" / "run_zero_kl_precision.sh"), *overrides]
    return subprocess.run(cmd, env=env, cwd=sweep_dir.parent, capture_output=True, text=True)


def _slurm_jobs(sweep_dir: Path) -> list[str]:
    """The Slurm job ids (`123`, or `123_0` for an array task) that ran, from their logs."""
    return sorted({p.parent.name for p in (sweep_dir / ".submitit").glob("*/*_log.err")})


def _state(job: str, wait_s: float = 120.0) -> str:
    """The job's final state. submitit returns once task 0 has written its result; the other
    tasks, the epilog and accounting may still be finishing, so a live state is waited out."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], capture_output=True)
        state = out.stdout.decode().strip()
        if state not in ("", "PENDING", "RUNNING", "COMPLETING") or time.monotonic() > deadline:
            return state
        time.sleep(1)


def test_sweep_through_slurm_and_its_report(tmp_path):
    """4 jobs through hydra/launcher=slurm (submitit_slurm); all zero; the report matches."""
    sweep = tmp_path / "sweep"
    out = _script(sweep, *ONE_BED, ONE_ARM, "rl.steps=3", *TINY)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = _slurm_jobs(sweep)
    assert len(jobs) == 4 and all(_state(j) == "COMPLETED" for j in jobs)
    runs = sorted(p for p in sweep.iterdir() if p.name.isdigit())
    assert len(runs) == 4
    for run_dir in runs:  # each job's result line, printed by the sweep's own process
        assert f"3 steps in {run_dir}: gen_kl_error exactly 0 at 3 of 3 steps" in out.stdout
    table = {r["run"][0]: r for r in parse_tables((sweep / "report.html").read_text())["runs"]}
    assert set(table) == {p.name for p in runs}
    for run_dir in runs:
        rows = _rows(run_dir / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1, 2]
        assert all(r["train/gen_kl_error"] == 0.0 for r in rows)
        row = table[run_dir.name]
        assert row["status"][0] == "complete" and row["steps"][1] == 3
        assert row["gen_kl_error max"][1] == max(r["train/gen_kl_error"] for r in rows)
        assert row["min bitwise frac"][1] == min(r["train/bitwise_equal_frac"] for r in rows)
        assert row["reward final"][1] == rows[-1]["reward/mean"]
    axes = {(r["precision"][0], r["kv"][0]) for r in table.values()}
    assert axes == {(p, k) for p in ("bf16", "mxfp8") for k in ("recompute", "persist")}
    assert (sweep / "report.md").read_text().count("| complete |") == 4


def test_bad_config_fails_only_its_job(tmp_path):
    sweep = tmp_path / "sweep"
    out = _script(sweep, *ONE_BED, ONE_ARM, "+precision=bf16", "kv=recompute", "rl.steps=2", *TINY,
                  "sampling.max_new_tokens=6,500")  # fmt: skip
    assert out.returncode != 0  # the sweep reports its failed job
    assert "Traceback" not in out.stderr, out.stderr[-3000:]  # its sentence, in the sweep's stderr
    tables = parse_tables((sweep / "report.html").read_text())
    by_tokens = {r["max_new_tokens"][0]: r for r in tables["runs"]}
    good, bad = by_tokens["6"], by_tokens["500"]
    assert good["status"][0] == "complete" and good["steps"][1] == 2
    sentence = (sweep / bad["run"][0] / "error.txt").read_text().strip()
    assert f"zkl: {sentence}" in out.stderr.splitlines()
    assert sentence.startswith("model.max_position_embeddings=128 is shorter than")
    assert "\n" not in sentence and sentence.endswith("max_new_tokens needs; raise it.")
    assert bad["status"][0] == "failed"
    assert {r["run"][0]: r["error"][0] for r in tables["failed"]} == {bad["run"][0]: sentence}
    assert md_escape(sentence) in (sweep / "report.md").read_text()  # its Markdown form


class Sweep:
    """A one-job multirun in the background; a watcher releases the job whenever it requeues.

    Slurm holds a requeued job for 120 s (BeginTime); the watcher lets it start at once. With
    `requeue_at`, the watcher requeues the job (`scontrol requeue`) once it logged that many
    steps.
    """

    def __init__(
        self, sweep_dir: Path, *overrides: str, wandb: str = "disabled", requeue_at: int = 0
    ) -> None:
        self.dir, self.requeue_at = sweep_dir, requeue_at
        cmd = [sys.executable, "-m", "zkl", "-m", "--config-dir", str(REPO / "sweeps")]
        cmd += ["--config-name", "precision_matrix", ONE_ARM, "hydra/launcher=slurm"]
        cmd += [f"hydra.sweep.dir={sweep_dir}", f"tracking.wandb.mode={wandb}", *overrides]
        self.proc = subprocess.Popen(
            cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    @property
    def job(self) -> str | None:
        jobs = _slurm_jobs(self.dir)
        return jobs[0] if jobs else None

    def _watch(self) -> None:
        while self.proc.poll() is None:
            job = self.job
            logged = len(_rows(self.dir / "0" / "metrics.jsonl"))
            if job and self.requeue_at and logged >= self.requeue_at:
                subprocess.run(["scontrol", "requeue", job], check=True)
                self.requeue_at = 0
            if job:
                state = subprocess.run(
                    ["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True
                )
                if state.stdout.decode().strip() == "PENDING BeginTime":
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
            time.sleep(0.5)

    def wait(self, timeout: float = 400) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        self.watcher.join()
        assert self.proc.returncode == 0, out.decode()[-4000:]
        return (self.dir / ".submitit" / self.job / f"{self.job}_0_log.err").read_text()


@pytest.fixture(scope="module")
def long_jobs(tmp_path_factory):
    """Two long jobs at once (one to requeue by hand, one past its time limit) and, meanwhile,
    the uninterrupted run of the same config in this process."""
    root = tmp_path_factory.mktemp("long")
    requeued = Sweep(root / "requeued", *LONG, wandb="offline", requeue_at=8)
    # USR2 45 s before the 1-minute limit: at least 15 s in, past the interpreter's start (a
    # signal before submitit's handler exists kills the attempt), and a slurmctld tick (~30 s)
    # always falls in the 45 s window before the limit.
    limit = ["hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=45"]
    timed = Sweep(root / "timed", *LONG, *limit, "hydra.launcher.max_num_timeout=20")
    run(make_cfg(*LONG), root / "reference")
    reference = _without_timing(_rows(root / "reference" / "metrics.jsonl"))
    yield requeued, timed, reference
    for sweep in (requeued, timed):  # after a failure: leave no job behind
        if sweep.proc.poll() is None:
            sweep.proc.kill()
            subprocess.run(["scancel", sweep.job or "0"])


def test_requeued_job_resumes_bitwise(long_jobs):
    """`scontrol requeue` mid-run: the job resumes from its checkpoint, W&B keeps its run id."""
    sweep, _, reference = long_jobs
    log = sweep.wait()
    resumed = [int(s) for s in re.findall(r"zkl: resuming \S+ from step (\d+)", log)]
    assert resumed and resumed[0] >= 5
    run_dir = sweep.dir / "0"
    assert _without_timing(_rows(run_dir / "metrics.jsonl")) == reference
    # Slurm's SIGTERM reaches the W&B service too, so the first attempt's log may be cut
    # short; the resumed attempt writes to the same run id, the checkpoint's (W&B names the
    # file `run-<id>.wandb`), and replays every earlier step (test_resume checks the replay).
    runs = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    wandb_id = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["wandb_id"]
    assert [p.name for p in runs] == [f"run-{wandb_id}.wandb"] * 2


def test_job_past_its_time_limit_resumes_bitwise(long_jobs):
    """A 1-minute Slurm limit: submitit's USR2 comes, the step ends, the state is saved, the
    launcher's checkpoint hook requeues the job, and it resumes until done."""
    _, sweep, reference = long_jobs
    log = sweep.wait(timeout=600)
    runs = subprocess.run(
        ["sacct", "-n", "-X", "-D", "-j", sweep.job, "-o", "State"], capture_output=True
    )
    assert len(runs.stdout.split()) >= 2  # requeued at least once
    resumed = [int(s) for s in re.findall(r"zkl: resuming \S+ from step (\d+)", log)]
    assert resumed and resumed[-1] > 0  # it really continued from a checkpoint
    assert _without_timing(_rows(sweep.dir / "0" / "metrics.jsonl")) == reference


def test_two_task_job_runs_at_world_size_2(tmp_path):
    """`hydra/launcher=slurm trainer.world_size=2`: one job of 2 Slurm tasks, one rank each
    (they meet through submitit's distributed environment), exactly zero at every step."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "zkl", "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}"]
    cmd += [*ONE_BED, "trainer.world_size=2", "rl.steps=3", "num_threads=1", *TINY]
    cmd += ["tracking.wandb.mode=disabled", "hydra.launcher.timeout_min=10"]
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (job,) = _slurm_jobs(sweep)
    assert _state(job) == "COMPLETED"
    tasks = sorted(p.name for p in (sweep / ".submitit" / job).glob("*_log.err"))
    assert tasks == [f"{job}_0_log.err", f"{job}_1_log.err"], tasks
    rows = _rows(sweep / "0" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    assert all(r["weights/changed_tensors"] > 0 for r in rows)

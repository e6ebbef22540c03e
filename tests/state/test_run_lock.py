"""One run a directory: a second live run is refused, naming the holder; a dead one blocks none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from zkl.errors import ConfigError
from zkl.state import run_lock
from zkl.state.config import CHECKPOINT_FILE

pytestmark = pytest.mark.slow  # whole experiments: `pytest -m "not slow"` skips them

REPO = Path(__file__).resolve().parents[2]
ARGS = ["tracking.wandb.mode=disabled", "tracking.progress=false"]
ARGS += ["rl.prompts_per_step=2", "rl.samples_per_prompt=2", "checkpoint.every=2"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def start(module: str, run_dir: Path, *overrides: str, env=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", module, f"hydra.run.dir={run_dir}", *ARGS, *overrides]
    return subprocess.Popen(
        cmd, env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def holder(run_dir: Path) -> subprocess.Popen:
    """A process that holds `run_dir`'s lock until killed."""
    code = (
        "import sys, time; from zkl.state import run_lock; run_lock.acquire(sys.argv[1]); "
        "print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)], env=ENV, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def rows(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def refusal(err: str, pid: int, run_dir: Path) -> None:
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines == [
        f"zkl: hydra.run.dir={run_dir} is in use by another zkl run (PID {pid}); wait for it "
        "to end, or choose another hydra.run.dir."
    ], err


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path):
    proc = holder(tmp_path)
    with pytest.raises(run_lock.RunDirInUse, match=rf"another zkl run \(PID {proc.pid}\)"):
        run_lock.acquire(tmp_path)
    assert run_lock.in_use(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (tmp_path / run_lock.LOCK_FILE).exists()  # the stale file stays and blocks nothing
    assert not run_lock.in_use(tmp_path)
    with run_lock.held(tmp_path), run_lock.held(tmp_path):  # re-entrant within a process
        assert not run_lock.in_use(tmp_path)


def test_two_runs_started_at_once_one_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    first, second = (start("zkl", run_dir, "rl.steps=12") for _ in range(2))
    outs = {p.pid: p.communicate(timeout=600) for p in (first, second)}
    codes = sorted(p.returncode for p in (first, second))
    assert codes == [0, 2], outs
    loser, winner = (first, second) if first.returncode == 2 else (second, first)
    refusal(outs[loser.pid][1], winner.pid, run_dir)
    assert rows(run_dir) == 12  # the winner's rows alone
    tokens = (run_dir / "tokens.jsonl").read_text().splitlines()
    assert len(tokens) == 12 * 4


def test_a_requeue_beside_a_live_attempt_is_refused_and_one_after_a_kill_resumes(tmp_path):
    requeue = {"SLURM_RESTART_COUNT": "1"}  # a Slurm requeue resumes by itself
    attempt = start("zkl", tmp_path, "rl.steps=400")
    while rows(tmp_path) < 3:
        assert attempt.poll() is None, attempt.communicate()[1]
        time.sleep(0.05)
    before = (tmp_path / "metrics.jsonl").read_text()
    second = start("zkl", tmp_path, "rl.steps=400", env=requeue)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 2
    refusal(err, attempt.pid, tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text().startswith(before)  # not truncated
    assert attempt.poll() is None  # the live attempt goes on
    attempt.send_signal(signal.SIGKILL)
    attempt.communicate(timeout=60)
    saved = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)["step"]
    again = start("zkl", tmp_path, f"rl.steps={saved + 1}", env=requeue)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"resuming {tmp_path} from step {saved}" in err
    assert rows(tmp_path) == saved + 1


def test_cert_refuses_a_run_directory_in_use_and_writes_nothing(tmp_path):
    proc = holder(tmp_path)
    try:
        cert = start("zkl.cert", tmp_path, "cert.steps=0")
        _, err = cert.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert cert.returncode == 2
    assert [x for x in err.splitlines() if x.strip()] == [
        f"zkl.cert: hydra.run.dir={tmp_path} is in use by another zkl run (PID {proc.pid}); "
        "wait for it to end, or choose another hydra.run.dir."
    ]
    assert not (tmp_path / "cert.jsonl").exists()


def test_a_cert_bed_directory_is_locked_by_its_run(tmp_path):
    from tests.conftest import cert_cfg
    from zkl.cert.beds import bed_dir, plan
    from zkl.cert.certificate import run_cert

    cfg = cert_cfg("cert.steps=2")
    bed = bed_dir(tmp_path, plan(cfg)[0])
    proc = holder(bed)
    try:
        with pytest.raises(ConfigError, match=rf"{bed} is in use .*PID {proc.pid}"):
            run_cert(cfg, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert rows(bed) == 0

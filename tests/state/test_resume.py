"""Checkpoint and resume: a resumed run's metrics.jsonl equals an uninterrupted run's, bitwise,
whether it stopped on a signal (Ctrl-C, SIGTERM, SIGKILL; a second Ctrl-C mid-step) or ended,
and whether `resume=true` names the run's folder or finds the latest run of its config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import make_cfg
from zkl.errors import ConfigError
from zkl.rl.loop import TIMING_PREFIXES, run
from zkl.run.validate import check_run
from zkl.state.config import CHECKPOINT_FILE
from zkl.tracking.errors import ERROR_FILE
from zkl.tracking.run_log import read_metrics

pytestmark = pytest.mark.slow  # whole experiments: `pytest -m "not slow"` skips them

REPO = Path(__file__).resolve().parents[2]
TINY = ["rl.prompts_per_step=2", "rl.samples_per_prompt=2", "tracking.dump_tokens=all"]
STEPS = 6


def without_timing(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 6-step run."""
    run_dir = tmp_path_factory.mktemp("reference")
    run(make_cfg(f"rl.steps={STEPS}", *TINY), run_dir)
    return run_dir


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert without_timing(run_dir / "metrics.jsonl") == without_timing(reference / "metrics.jsonl")
    assert (run_dir / "tokens.jsonl").read_text() == (reference / "tokens.jsonl").read_text()


def test_resume_by_hand_equals_uninterrupted(reference, tmp_path):
    """3 steps, stop, `resume=true` to 6: the same rows, tokens and final weights."""
    run(make_cfg("rl.steps=3", "checkpoint.every=2", *TINY), tmp_path)
    assert torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)["step"] == 3
    rows = run(make_cfg(f"rl.steps={STEPS}", "resume=true", *TINY), tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert_same_run(tmp_path, reference)
    final = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    assert final["step"] == STEPS and final["policy"]["version"] == STEPS


def _start(run_dir: Path | None, *overrides: str, cwd: Path | None = None) -> subprocess.Popen:
    """`python -m zkl` into `run_dir` (None: Hydra's own fresh folder under `cwd`)."""
    cmd = [sys.executable, "-m", "zkl", "tracking.progress=false", "tracking.wandb.mode=disabled"]
    cmd += [*TINY, *overrides] + ([f"hydra.run.dir={run_dir}"] if run_dir else [])
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_rows(run_dir: Path, count: int, proc: subprocess.Popen) -> None:
    metrics = run_dir / "metrics.jsonl"
    for _ in range(1200):
        if metrics.exists() and metrics.read_text().count("\n") >= count:
            return
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    raise AssertionError(f"{metrics} never reached {count} rows")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_killed_run_resumes_without_losing_or_repeating_a_step(sig, reference, tmp_path):
    """Ctrl-C, SIGTERM: the step finishes, is saved, the run exits. SIGKILL: back to the last
    save."""
    proc = _start(tmp_path, f"rl.steps={STEPS}", "checkpoint.every=2")
    _wait_for_rows(tmp_path, 3, proc)  # step 2 began: the save after step 1 is on disk
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (128 + sig if sig != signal.SIGKILL else -sig), err
    logged = len((tmp_path / "metrics.jsonl").read_text().splitlines())
    saved = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)["step"]
    if sig != signal.SIGKILL:
        assert saved == logged < STEPS  # saved at the end of the step it was in
        assert f"zkl: stopped by {sig.name}; steps 0-{logged - 1} are logged and saved" in err
    else:
        assert saved % 2 == 0 and saved <= logged
    again = _start(tmp_path, f"rl.steps={STEPS}", "resume=true")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"resuming {tmp_path} from step {saved}" in err
    assert_same_run(tmp_path, reference)


def test_ctrl_c_twice_mid_step_resumes_from_the_last_save(reference, tmp_path):
    """The second Ctrl-C abandons step 2 (stalled in its reward): nothing of it is logged or
    saved; the resumed run redoes it and equals the uninterrupted one bitwise."""
    from tests.test_faults import ctrl_c_twice, stall_then, stalling_task

    run_dir = tmp_path / "run"
    args = [*TINY, f"rl.steps={STEPS}", "checkpoint.every=1"]
    proc, err = stall_then(run_dir, args, stall_at=8)  # the first reward of step 2
    lines = ctrl_c_twice(proc, err)
    assert proc.returncode == 130, lines
    assert lines[-1] == (
        f"zkl: interrupted; step 2 is abandoned; steps 0-1 are logged and saved: resume=true "
        f"hydra.run.dir={run_dir} continues from step 2."
    )
    assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["step"] == 2
    again = _start(run_dir, f"rl.steps={STEPS}", "resume=true", *stalling_task(run_dir, 8))
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert_same_run(run_dir, reference)


def _run_folders(root: Path) -> list[Path]:
    return sorted(p for p in (root / "outputs").glob("*/*") if p.is_dir())


def test_resume_without_a_run_dir_continues_the_latest_run_of_the_config(reference, tmp_path):
    """As W&B's resume="auto": `resume=true` alone continues the latest run of the same config
    (rl.steps may differ) in its own folder, bitwise; another config is refused in one sentence
    naming the folders, before Hydra makes one."""
    first = _start(None, "rl.steps=3", "checkpoint.every=2", cwd=tmp_path)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    other = _start(None, "rl.steps=1", "rl.lr=0.02", cwd=tmp_path)  # a later run, another config
    assert other.wait(timeout=300) == 0, other.stderr.read()
    mine, theirs = _run_folders(tmp_path)
    again = _start(None, f"rl.steps={STEPS}", "resume=true", cwd=tmp_path)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    relative = mine.relative_to(tmp_path)
    assert f"zkl: resume=true continues {relative}, the latest run of this config." in err
    assert f"resuming {mine} from step 3" in err
    assert _run_folders(tmp_path) == [mine, theirs]  # no new folder
    assert_same_run(mine, reference)
    refused = _start(None, "resume=true", "rl.lr=0.5", cwd=tmp_path)
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2
    assert err.splitlines() == [
        "zkl: resume=true found no run of this config to continue among the 2 folders matching "
        f"outputs/*/* ({relative}: another config (rl.lr was 0.01, now 0.5); "
        f"{theirs.relative_to(tmp_path)}: another config (rl.lr was 0.02, now 0.5)); pass "
        "hydra.run.dir=DIR of the run to continue, or drop resume=true to start afresh."
    ]
    assert _run_folders(tmp_path) == [mine, theirs]


def test_run_into_used_directory_refuses(tmp_path):
    run(make_cfg("rl.steps=1", *TINY), tmp_path)
    with pytest.raises(ConfigError, match=r"already holds metrics.jsonl: pass resume=true"):
        run(make_cfg("rl.steps=1", *TINY), tmp_path)
    proc = _start(tmp_path, "rl.steps=1")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    (sentence,) = [line for line in err.splitlines() if line.startswith("zkl:")]
    assert sentence.endswith("or choose another hydra.run.dir.")
    # A single run's refusal goes to stderr only: the finished run there is not marked failed.
    assert not (tmp_path / ERROR_FILE).exists()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1  # nothing appended


def test_resume_refuses_another_config(tmp_path):
    run(make_cfg("rl.steps=1", *TINY), tmp_path)
    with pytest.raises(ConfigError, match=r"rl.lr was 0.01, now 0.02"):
        run(make_cfg("rl.steps=2", "resume=true", "rl.lr=0.02", *TINY), tmp_path)


def test_resume_refuses_stale_prefix_cache(tmp_path):
    """With kv_invalidate_on_refit off the prefix cache outlives refits; it is not saved."""
    base = ["kv=persist", "fixes.kv_invalidate_on_refit=false", *TINY]
    run(make_cfg("rl.steps=1", *base), tmp_path)
    with pytest.raises(ConfigError, match="cannot resume bitwise"):
        run(make_cfg("rl.steps=2", "resume=true", *base), tmp_path)


def test_resume_continues_the_wandb_run(tmp_path, wandb_runs):
    """The resumed run logs to the same W&B run id and hands W&B every step again: the
    earlier steps' rows from metrics.jsonl (which W&B may have lost), then its own."""
    run(make_cfg("rl.steps=1", *TINY, quiet=False), tmp_path, progress=False)
    run(make_cfg("rl.steps=2", "resume=true", *TINY, quiet=False), tmp_path, progress=False)
    first, second = (wb.id for wb in wandb_runs.runs)
    assert first == second == torch.load(tmp_path / CHECKPOINT_FILE)["wandb_id"]
    logs = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [p.name for p in logs] == [f"run-{first}.wandb"] * 2
    assert wandb_runs.steps(0) == [0] and wandb_runs.steps(1) == [0, 1]
    assert [row for _, row in wandb_runs.logged[1]] == read_metrics(tmp_path)


def test_checkpoint_save_false_writes_none_and_cannot_resume(tmp_path):
    rows = run(
        make_cfg("rl.steps=2", "checkpoint.save=false", "checkpoint.every=1", *TINY), tmp_path
    )
    assert len(rows) == 2 and not (tmp_path / CHECKPOINT_FILE).exists()
    with pytest.raises(ConfigError, match=r"checkpoint.save=false writes none; set checkpoint"):
        check_run(make_cfg("rl.steps=3", "resume=true", "checkpoint.save=false", *TINY))
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2  # nothing lost


def test_checkpoints_that_would_fill_the_disk_are_refused_before_any_work(tmp_path, monkeypatch):
    from zkl.state import resume

    need = resume.checkpoint_bytes(make_cfg(*TINY))
    free = type("Usage", (), {"free": need + 1})()
    monkeypatch.setattr(resume.shutil, "disk_usage", lambda path: free)
    run(make_cfg("rl.steps=1", *TINY), tmp_path / "fits")  # one save: room for one
    with pytest.raises(ConfigError, match=r"set checkpoint.save=false, or choose a hydra.run.dir"):
        run(make_cfg("rl.steps=4", "checkpoint.every=2", *TINY), tmp_path / "two")
    assert not (tmp_path / "two" / "metrics.jsonl").exists()
    # resuming beside a checkpoint already on the disk needs room for one more only
    run(make_cfg("rl.steps=4", "checkpoint.every=2", "resume=true", *TINY), tmp_path / "fits")
    run(
        make_cfg("rl.steps=4", "checkpoint.every=2", "checkpoint.save=false", *TINY),
        tmp_path / "off",
    )

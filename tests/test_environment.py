"""Environment variables zkl (or W&B for it) reads: a bad value is one sentence, exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_cfg
from zkl import environment
from zkl.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
TINY = ["rl.prompts_per_step=2", "rl.samples_per_prompt=2", "rl.steps=1"]


@pytest.mark.parametrize("value", ["USR2", "SIGUSR2", "usr2", " SIGUSR2 "])
def test_the_preemption_signal_takes_both_spellings(monkeypatch, value):
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", value)
    assert environment.preempt_signal() == signal.SIGUSR2


@pytest.mark.parametrize("value", ["SIGSIGUSR2", "12", "KILL", "", "x y", "SIG_IGN"])
def test_a_bad_preemption_signal_is_one_sentence(monkeypatch, value):
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", value)
    with pytest.raises(ConfigError, match=r"^SUBMITIT_PREEMPT_SIGNAL=.* set it to a signal name"):
        environment.preempt_signal()


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "١"])
def test_a_bad_restart_count_is_one_sentence(monkeypatch, value):
    monkeypatch.setenv("SLURM_RESTART_COUNT", value)
    with pytest.raises(ConfigError, match=r"^SLURM_RESTART_COUNT=.* unset it outside a Slurm job"):
        environment.restart_count()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert environment.restart_count() == 3


def entry(tmp_path: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "zkl", f"hydra.run.dir={tmp_path}", *TINY, *overrides]
    cmd += ["tracking.progress=false"]
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "name, value",
    [
        ("WANDB_MODE", "garbage"),
        ("WANDB_SILENT", "garbage"),
        ("SLURM_RESTART_COUNT", "x"),
        ("SUBMITIT_PREEMPT_SIGNAL", "NOPE"),
    ],
)
@pytest.mark.slow
def test_the_entry_point_refuses_a_bad_variable_before_any_work(tmp_path, name, value):
    out = entry(tmp_path, {name: value})
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"zkl: {name}={value!r} "), lines
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_run_with_the_sig_spelling_runs(tmp_path):
    out = entry(tmp_path, {"SUBMITIT_PREEMPT_SIGNAL": "SIGUSR2"}, "tracking.wandb.mode=disabled")
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_disk_check_names_small_sizes_in_small_units(tmp_path, monkeypatch):
    from zkl.rl.loop import run
    from zkl.state import resume

    monkeypatch.setattr(resume.shutil, "disk_usage", lambda path: type("U", (), {"free": 5})())
    with pytest.raises(ConfigError) as err:
        run(make_cfg(*TINY), tmp_path)
    message = str(err.value)
    assert "0.0 GB" not in message and " has 5 B free" in message, message
    need = resume.checkpoint_bytes(make_cfg(*TINY))
    assert f"need about {resume.size_text(need)} but" in message
    assert [resume.size_text(n) for n in (0, 999, 1500, 2.5e6, 7.25e9, 3e12)] == [
        "0 B",
        "999 B",
        "1.5 kB",
        "2.5 MB",
        "7.2 GB",
        "3.0 TB",
    ]

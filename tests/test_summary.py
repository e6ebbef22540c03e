"""The last console line of `python -m zkl`: steps exactly 0 out of the steps run, or the
mismatch's mean and max when some were not, and the last `val/accuracy` when validation ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zkl.rl.summary import summary_line
from zkl.tracking.run_log import read_metrics

REPO = Path(__file__).resolve().parent.parent


def _row(step: int, kl: float, diff: float, reward: float = 0.5, **extra) -> dict:
    return {
        "step": step,
        "train/gen_kl_error": kl,
        "train/max_abs_logprob_diff": diff,
        "reward/mean": reward,
        **extra,
    }


def test_every_step_zero_is_counted_over_the_steps_run():
    rows = [_row(0, 0.0, 0.0, 0.25), _row(1, 0.0, 0.0), _row(2, 0.0, 0.0, 0.75)]
    line = summary_line(rows, "DIR")
    assert line == "3 steps in DIR: 3 of 3 exactly 0; reward first=0.250 last=0.750"


def test_a_run_with_mismatch_gives_how_many_were_zero_and_the_mean_and_max():
    """The last step exactly 0 does not hide the earlier steps' mismatch."""
    rows = [_row(0, 2e-5, 0.01), _row(1, 4e-5, 0.03), _row(2, 0.0, 0.0)]
    line = summary_line(rows, "DIR")
    assert "3 steps in DIR: 1 of 3 exactly 0; " in line
    assert "gen_kl_error mean=2e-05 max=4e-05 max_abs_logprob_diff max=0.03" in line


def test_the_last_validation_is_shown():
    rows = [_row(0, 0.0, 0.0, **{"val/accuracy": 0.125}), _row(1, 0.0, 0.0)]
    rows += [_row(2, 0.0, 0.0, **{"val/accuracy": 0.5}), _row(3, 0.0, 0.0)]
    assert summary_line(rows, "DIR").endswith("; val/accuracy=0.500 (before step 2)")
    assert "val/" not in summary_line(rows[1:2], "DIR")  # no validation, nothing said


@pytest.mark.slow  # a whole (two-step) experiment
def test_python_m_zkl_ends_with_the_summary(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "zkl", "rl.steps=2", "rl.val_every=1", "rl.val_prompts=4"]
    cmd += ["rl.prompts_per_step=2", "rl.samples_per_prompt=2", "tracking.progress=false"]
    out = subprocess.run(
        [*cmd, f"hydra.run.dir={tmp_path}"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last == summary_line(read_metrics(tmp_path), tmp_path)
    assert ": 2 of 2 exactly 0; " in last and "; val/accuracy=" in last

"""The last console line of `python -m zkl`: `gen_kl_error` exactly 0 at how many of the steps
run, or its mean and max when some were not, the last `val/accuracy` when validation ran, and
the steps that trained nothing, with why; the warning when N steps in a row trained nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zkl.rl.summary import summary_line
from zkl.rl.trained import warn_untrained
from zkl.tracking.run_log import read_metrics

REPO = Path(__file__).resolve().parents[2]


def _row(step: int, kl: float, diff: float, reward: float = 0.5, **extra) -> dict:
    return {
        "step": step,
        "train/gen_kl_error": kl,
        "train/max_abs_logprob_diff": diff,
        "reward/mean": reward,
        "rl/zero_adv_frac": 0.25,  # trained, unless `extra` says otherwise
        "weights/changed_tensors": 7,
        **extra,
    }


ZERO_ADV = {"rl/zero_adv_frac": 1.0, "weights/changed_tensors": 0}
NO_CHANGE = {"rl/zero_adv_frac": 0.5, "weights/changed_tensors": 0}


def test_every_step_zero_is_counted_over_the_steps_run():
    rows = [_row(0, 0.0, 0.0, 0.25), _row(1, 0.0, 0.0), _row(2, 0.0, 0.0, 0.75)]
    line = summary_line(rows, "DIR")
    assert line == (
        "3 steps in DIR: gen_kl_error exactly 0 at 3 of 3 steps; reward first=0.250 last=0.750"
    )
    assert summary_line(rows[:1], "DIR").startswith("1 step in DIR: gen_kl_error exactly 0 at ")


def test_a_run_with_mismatch_gives_how_many_were_zero_and_the_mean_and_max():
    """The last step exactly 0 does not hide the earlier steps' mismatch."""
    rows = [_row(0, 2e-5, 0.01), _row(1, 4e-5, 0.03), _row(2, 0.0, 0.0)]
    line = summary_line(rows, "DIR")
    assert line.startswith(
        "3 steps in DIR: gen_kl_error exactly 0 at 1 of 3 steps, mean=2e-05 max=4e-05 "
        "(max_abs_logprob_diff max=0.03); "
    )


def test_a_run_that_trained_nothing_ends_saying_so_and_why():
    """Every group's rewards equal: all advantages zero (the GSM8K run of issue 44)."""
    rows = [_row(s, 0.0, 0.0, 0.0, **ZERO_ADV) for s in range(3)]
    assert summary_line(rows, "DIR") == (
        "3 steps in DIR: gen_kl_error exactly 0 at 3 of 3 steps; reward first=0.000 "
        "last=0.000; no step trained: every advantage was zero (each group's rewards were "
        "equal: check task.reward, or raise rl.samples_per_prompt)."
    )
    rows = [_row(s, 0.0, 0.0, **NO_CHANGE) for s in range(2)]
    assert summary_line(rows, "DIR").endswith(
        "; no step trained: the update changed none of the weights the generator gets (a "
        "learning rate below their resolution: raise rl.lr)."
    )
    rows = [_row(0, 0.0, 0.0, **ZERO_ADV), _row(1, 0.0, 0.0), _row(2, 0.0, 0.0, **NO_CHANGE)]
    line = summary_line(rows, "DIR")
    assert "; 2 of 3 steps trained nothing: every advantage was zero (" in line
    assert ") or the update changed none of the weights" in line
    assert "trained" not in summary_line([_row(0, 0.0, 0.0)], "DIR")


def test_the_warning_comes_once_as_the_streak_reaches_n(capsys):
    rows: list[dict] = []
    said = []
    kinds = [ZERO_ADV, ZERO_ADV, {}, ZERO_ADV, ZERO_ADV, ZERO_ADV, ZERO_ADV, NO_CHANGE]
    for step, kind in enumerate(kinds):
        rows.append(_row(step, 0.0, 0.0, **kind))
        warn_untrained(rows, 3, lr=1e-10)
        said.append(capsys.readouterr().err)
    assert [bool(s) for s in said] == [False] * 5 + [True, False, False]
    assert said[5] == (
        "zkl: warning: steps 3-5 trained nothing, 3 in a row: every advantage was zero (each "
        "group's rewards were equal: check task.reward, or raise rl.samples_per_prompt) "
        "(rl.warn_untrained_after=3 sets when this is said).\n"
    )
    rows = [_row(s, 0.0, 0.0, **NO_CHANGE) for s in range(2)]
    warn_untrained(rows, 2, lr=1e-10)
    assert (
        "(a learning rate below their resolution: raise rl.lr, now 1e-10) ("
        in capsys.readouterr().err
    )
    warn_untrained(rows, 0, lr=1e-10)  # 0: never
    assert capsys.readouterr().err == ""


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
    assert ": gen_kl_error exactly 0 at 2 of 2 steps; " in last and "; val/accuracy=" in last


@pytest.mark.slow  # a whole (three-step) experiment
def test_a_run_that_trains_nothing_warns_at_once_and_ends_saying_why(tmp_path):
    """Every reward 0.0: the warning comes as the second untrained step is logged (N=2), once;
    the last line names gen_kl_error and says no step trained, and why."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}
    cmd = [sys.executable, "-m", "zkl", "rl.steps=3", "rl.warn_untrained_after=2"]
    cmd += ["task._target_=user_rewards:NoCreditTask", "tracking.wandb.mode=disabled"]
    cmd += ["rl.prompts_per_step=2", "rl.samples_per_prompt=2", "tracking.progress=false"]
    out = subprocess.run(
        [*cmd, f"hydra.run.dir={tmp_path}"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.splitlines() == [
        "zkl: warning: steps 0-1 trained nothing, 2 in a row: every advantage was zero (each "
        "group's rewards were equal: check task.reward, or raise rl.samples_per_prompt) "
        "(rl.warn_untrained_after=2 sets when this is said)."
    ]
    rows = read_metrics(tmp_path)
    assert [r["rl/zero_adv_frac"] for r in rows] == [1.0] * 3
    assert [r["weights/changed_tensors"] for r in rows] == [0] * 3
    last = out.stdout.strip().splitlines()[-1]
    assert last == summary_line(rows, tmp_path)
    assert last.startswith(f"3 steps in {tmp_path}: gen_kl_error exactly 0 at 3 of 3 steps; ")
    assert last.endswith(
        "; no step trained: every advantage was zero (each group's rewards "
        "were equal: check task.reward, or raise rl.samples_per_prompt)."
    )

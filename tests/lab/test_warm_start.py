"""The supervised warm start (`python -m zkl.lab.warm_start`): it learns the task, its
checkpoint is what `model.checkpoint` reads, and what it cannot do stops before any step."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.conftest import make_cfg
from zkl.data.tasks import build_task
from zkl.errors import ConfigError
from zkl.lab.supervised import accuracy, warm_start
from zkl.models.build import build_model


def test_it_learns_add_and_writes_what_model_checkpoint_reads(tmp_path):
    cfg = make_cfg("num_threads=1")
    task = build_task(cfg)
    before = accuracy(cfg, task, build_model(cfg.model, torch.float32, seed=cfg.seed))
    after = warm_start(tmp_path, make_cfg("num_threads=1"), steps=40, lr=3e-3, batch_size=64)
    assert before == 0.0 and after >= 0.2, (before, after)  # measured 0.0 -> 0.32
    back = make_cfg(f"model.checkpoint={tmp_path}")
    model = build_model(back.model, torch.float32)
    assert accuracy(back, task, model) == after


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["task=residue"], "task.name=residue has no right response"),
        (["model=tiny_hybrid"], "not 'nemotron_h'"),
        (["rl.stepz=2"], "rl.stepz"),
    ],
)
def test_what_it_cannot_do_is_one_sentence_before_any_step(overrides, words, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "zkl.lab.warm_start", str(tmp_path / "w"), *overrides],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    message = [line for line in out.stderr.splitlines() if line.startswith("zkl.")]
    assert len(message) == 1 and words in message[0], out.stderr[-2000:]
    assert "step 10" not in out.stdout and not (tmp_path / "w").exists()


def test_bad_numbers_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="--steps, --lr and --batch"):
        warm_start(tmp_path, make_cfg(), steps=0, lr=3e-3, batch_size=64)

"""GRPO from a tiny Llama / Mistral / gpt-oss checkpoint alone (`model.checkpoint=DIR`): zero
mode keeps the train/gen mismatch at exactly 0 every step while every step trains, at both
corners of the matrix (colocated, recompute, bf16; dedicated, persist, mxfp8). The whole
matrix over 10 steps is scripts/family_exactness.py, recorded in docs/families.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from zkl.rl.loop import run
from zkl.run.compose import compose

pytestmark = pytest.mark.slow  # whole runs: `pytest -m "not slow"` skips them

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "family_exactness", REPO / "scripts" / "family_exactness.py"
)
exactness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(exactness)


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt_oss"])
@pytest.mark.parametrize(
    "layout, kv, precision",
    [("colocated", "recompute", "bf16"), ("dedicated", "persist", "mxfp8")],
)
def test_checkpoint_alone_runs_exactly_zero(tmp_path_factory, family, layout, kv, precision):
    checkpoint = exactness.write_checkpoint(tmp_path_factory.getbasetemp() / family, family)
    run_dir = tmp_path_factory.mktemp("run")
    cfg = compose(exactness.overrides(checkpoint, layout, kv, precision, steps=2))
    assert cfg.model.family == family and cfg.model.checkpoint == str(checkpoint)
    rows = run(cfg, run_dir)
    assert len(rows) == 2
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    assert all(r["train/gen_kl_error"] == 0.0 for r in rows)
    assert all(r["optim/update_norm"] > 0 and r["weights/changed_tensors"] > 0 for r in rows)

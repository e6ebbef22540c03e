"""`python -m zkl` exactly as the README runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_python_m_zkl_writes_zero_metrics(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "zkl", "+precision=bf16", "+layout=colocated", "rl.steps=3"]
    out = subprocess.run(
        [*cmd, f"hydra.run.dir={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["train/gen_kl_error"] == 0.0 for r in rows)
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "tokens.jsonl").exists()


def test_bench_measures_both_modes(tmp_path):
    from tests.conftest import SMALL, bench_cfg
    from zkl.lab.bench import run_bench

    result = run_bench(bench_cfg(*SMALL), tmp_path)
    assert result["zero/gen_tokens_per_s"] > 0 and result["default/gen_tokens_per_s"] > 0
    assert result["zero/decode_tokens_per_s"] > 0
    assert "ratio/decode_time_mamba_fix_on_over_off" not in result  # no Mamba layers
    assert (tmp_path / "bench.json").exists()

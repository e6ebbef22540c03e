"""Certification: step-0 and multi-step beds, the ablation table, the exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import SMALL, make_cfg

from zkl.cert import format_table, run_cert

REPO = Path(__file__).resolve().parent.parent


def _cert_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "zkl.cert", "tracking.wandb.mode=disabled", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)


def test_cert_cli_passes_default_beds_and_fails_without_fixes(tmp_path):
    ok = _cert_cli(f"hydra.run.dir={tmp_path / 'zero'}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    beds = [json.loads(x) for x in (tmp_path / "zero" / "cert.jsonl").read_text().splitlines()]
    assert {b["bed"] for b in beds} == {
        f"{m}/colocated/{p}/kv_{kv}"
        for m in ("tiny_dense", "tiny_moe")
        for p in ("bf16", "mxfp8")
        for kv in ("recompute", "persist")
    }
    assert all(b["passed"] and b["train/max_abs_logprob_diff"] == 0.0 for b in beds)
    assert ok.stdout.count("PASS") == 8
    bad = _cert_cli(
        f"hydra.run.dir={tmp_path / 'off'}", "zero_train_gen_mismatch=false", cwd=tmp_path
    )
    assert bad.returncode == 1
    assert bad.stdout.count("FAIL") == 8


def test_multi_step_cert_both_layouts(tmp_path):
    cfg = make_cfg(
        "cert.steps=2", "cert.layouts=[colocated,dedicated]", "cert.kv=[persist]", *SMALL
    )
    results = run_cert(cfg, tmp_path)
    assert len(results) == 12  # 3 models x 2 layouts x {bf16, mxfp8}
    assert all(r["passed"] and r["steps"] == 2 and r["nonzero_steps"] == 0 for r in results)


def test_ablation_reports_each_fix(tmp_path):
    cfg = make_cfg(
        "cert.ablate=true",
        "cert.models=[tiny_moe]",
        "cert.kv=[recompute]",
        "cert.precisions=[bf16]",
    )
    results = run_cert(cfg, tmp_path)
    by_variant = {r["variant"]: r for r in results}
    assert by_variant["all fixes"]["passed"]
    assert not by_variant["-attention_fixed_split"]["passed"]
    assert not by_variant["-logprob_path"]["passed"]
    assert not by_variant["-refit_exactness"]["passed"]
    table = format_table(results, ablate=True)
    assert "contributes error" in table
    # fixes whose source this CPU does not trigger in this bed are reported, not hidden
    assert "no effect on this machine" in table

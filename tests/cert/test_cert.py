"""Certification: what a bed is, refusals, vacuous beds, the ablation table, the exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import SMALL, cert_cfg
from zkl import invariance
from zkl.cert import ablation
from zkl.cert.beds import beds, plan
from zkl.cert.certificate import execute, run_cert
from zkl.errors import ConfigError

pytestmark = pytest.mark.slow  # whole experiments: `pytest -m "not slow"` skips them

REPO = Path(__file__).resolve().parents[2]
MATRIX = ["cert.models=[tiny_dense,tiny_moe]", "cert.precisions=[bf16,mxfp8]"]


def _cert_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "zkl.cert", "tracking.wandb.mode=disabled", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "cert.jsonl").read_text().splitlines()]


def test_cert_cli_certifies_the_users_config(tmp_path):
    """The user's model and its overrides are the bed; progress per run; result files named."""
    out = _cert_cli(
        f"hydra.run.dir={tmp_path}",
        "model=tiny_moe",
        "model.num_hidden_layers=1",
        "cert.steps=2",
        *SMALL,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (row,) = _rows(tmp_path)
    assert row["bed"] == "tiny_moe/colocated/bf16/kv_recompute" and row["passed"]
    assert row["steps"] == 2 and row["weight_version"] == 1 and row["update_norm"] > 0
    folder = tmp_path / "beds" / "tiny_moe" / "colocated" / "bf16" / "kv_recompute"
    run_cfg = OmegaConf.load(folder / "steps2" / "all_fixes" / "config.yaml")
    assert run_cfg.model.num_hidden_layers == 1 and run_cfg.model.moe.num_experts == 8
    assert not [p for p in tmp_path.rglob("*") if " " in p.name]
    assert "[1/1] tiny_moe/colocated/bf16/kv_recompute all_fixes (steps2) ..." in out.stderr
    assert "[1/1] tiny_moe/colocated/bf16/kv_recompute all_fixes (steps2): PASS" in out.stderr
    head = out.stdout.splitlines()[0].split()
    assert head[-3:] == ["update_norm", "version", "result"]
    assert out.stdout.splitlines()[-1] == (
        f"results: {tmp_path / 'cert.jsonl'} (one JSON object per row), {tmp_path / 'cert.txt'}"
    )
    assert (tmp_path / "cert.txt").read_text().splitlines() == out.stdout.splitlines()[:-1]


def test_beds_vary_only_the_named_axes():
    cfg = cert_cfg("model=tiny_moe", "model.num_hidden_layers=1", "+precision=fp32")
    assert beds(cfg) == [cfg]  # nothing named: the user's config is the one bed
    named = beds(cert_cfg("model.num_hidden_layers=1", "cert.models=[tiny_dense,tiny_moe]"))
    assert [(b.model.name, b.model.num_hidden_layers) for b in named] == [
        ("tiny_dense", 1),
        ("tiny_moe", 1),
    ]
    assert named[1].model.moe.num_experts == 8 and named[0].precision.name == "bf16"
    kept = beds(cert_cfg("+precision=fp32", "precision.master_weights_fp32=true", *MATRIX))
    assert len(kept) == 4 and {b.precision.name for b in kept} == {"bf16", "mxfp8"}
    assert all(b.precision.master_weights_fp32 for b in kept)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["precision.native=true"], "precision.native"),
        (["+layout=dedicated", "layout.transport=nccl"], "layout.transport=nccl"),
        (["model.checkpoint=/nonexistent"], "model.checkpoint"),
        (["cert.models=[]"], "cert.models=[]"),
        (["cert.steps=1"], "cert.steps=1"),
    ],
)
def test_cert_refuses_what_it_cannot_certify(overrides, key, tmp_path):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")) as err:
        run_cert(cert_cfg(*overrides), tmp_path)
    assert str(err.value).count(". ") == 0  # one sentence
    assert not (tmp_path / "cert.jsonl").exists()  # refused before any work


def test_cert_cli_refusal_exits_2(tmp_path):
    out = _cert_cli(f"hydra.run.dir={tmp_path}", "cert.models=[]", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("zkl.cert: cert.models=[] names no model")


def test_matrix_passes_and_fails_without_fixes(tmp_path):
    """The 8 step-0 beds of the CPU matrix pass; without fixes the user's bed fails."""
    results = run_cert(cert_cfg(*MATRIX, "cert.kv=[recompute,persist]"), tmp_path / "zero")
    assert {r["bed"] for r in results} == {
        f"{m}/colocated/{p}/kv_{kv}"
        for m in ("tiny_dense", "tiny_moe")
        for p in ("bf16", "mxfp8")
        for kv in ("recompute", "persist")
    }
    assert all(r["passed"] and r["train/max_abs_logprob_diff"] == 0.0 for r in results)
    (bad,) = run_cert(cert_cfg("zero_train_gen_mismatch=false"), tmp_path / "off")
    assert bad["variant"] == "no_fixes" and not bad["passed"] and bad["result"] == "FAIL"


def test_multi_step_cert_both_layouts(tmp_path):
    cfg = cert_cfg("cert.steps=2", "cert.layouts=[colocated,dedicated]", *MATRIX, *SMALL)
    results = run_cert(cfg, tmp_path)
    assert len(results) == 8  # 2 models x 2 layouts x {bf16, mxfp8}, kv=recompute
    assert all(r["passed"] and r["steps"] == 2 and r["nonzero_steps"] == 0 for r in results)
    assert all(r["reasons"] == [] and r["weight_version"] == 1 for r in results)


def _failed_because(results: list[dict], reason: str) -> dict:
    (row,) = results
    assert not row["passed"] and row["result"].startswith("FAIL: ")
    assert any(reason in r for r in row["reasons"]), row["reasons"]
    return row


def test_all_equal_rewards_fail(tmp_path, monkeypatch):
    from zkl.data.tasks import AddTask

    monkeypatch.setattr(AddTask, "reward", lambda self, problem, response: 1.0)
    row = _failed_because(
        run_cert(cert_cfg("cert.steps=2", *SMALL), tmp_path), "every advantage of step 0"
    )
    assert row["train/max_abs_logprob_diff"] == 0.0 and row["update_norm"] == 0.0


def test_learning_rate_below_bf16_resolution_fails(tmp_path):
    """The fp32 master moves; the bf16 weights the generator gets do not (update_norm 0)."""
    row = _failed_because(
        run_cert(cert_cfg("cert.steps=2", "rl.lr=1e-9", *SMALL), tmp_path),
        "changed none of the weights the generator gets",
    )
    assert row["train/max_abs_logprob_diff"] == 0.0 and row["update_norm"] == 0.0


def test_missing_refit_fails(tmp_path, monkeypatch):
    """Colocated shares the weights, so logprobs still agree: only the version tells."""
    from zkl.layouts.colocated import ColocatedGenerator

    monkeypatch.setattr(ColocatedGenerator, "refit", lambda self, state, version: None)
    row = _failed_because(
        run_cert(cert_cfg("cert.steps=2", *SMALL), tmp_path),
        "step 1 rolled out with weight version 0, not the refitted 1",
    )
    assert row["train/max_abs_logprob_diff"] == 0.0


def test_ablation_exposes_every_fix_on_the_default_bed(tmp_path):
    results = run_cert(cert_cfg("cert.ablate=true", *SMALL), tmp_path)
    (bed,) = [r for r in results if r["kind"] == "bed"]
    assert bed["passed"] and bed["variant"] == "all_fixes" and bed["mode"] == "step0"
    assert all(r["passed"] for r in results if r["kind"] == "reference")
    rows = {r["fix"]: r for r in results if r["kind"] == "ablation"}
    assert list(rows) == list(invariance.FIXES)
    modes = {fix: r["mode"] for fix, r in rows.items()}
    assert modes["batch_invariant_gemm"] == "step0-fp32"
    assert modes["kv_invalidate_on_refit"] == "steps2-mxfp8-kv_persist"
    known = {
        "batch_invariant_reductions": "no effect: the CPU splits a row sum by shape only",
        "moe_combine_order": "no effect: tiny_dense has no MoE layer",
        "mamba_chunked_decode": "no effect: tiny_dense has no Mamba layer",
    }
    for fix, row in rows.items():
        assert row["variant"] == f"minus_{fix}"
        assert row["result"].startswith(known.get(fix, "contributes error")), row


def test_ablation_mode_the_bed_cannot_run_is_a_row_not_a_refusal(tmp_path):
    runs = plan(cert_cfg("cert.ablate=true", "model.hidden_size=48"))
    refused = [r for r in runs if r.refused]
    assert {r.fix for r in refused} == {
        None,  # the reference in that mode
        "kv_invalidate_on_refit",
        "refit_exactness",
        "quantized_weight_refresh",
    }
    row = execute(refused[-1], tmp_path, [])
    assert row["result"] == (
        "cannot run in this mode: model.hidden_size must be a multiple of 32 for precision=mxfp8."
    )
    assert not row["passed"] and not (tmp_path / "beds").exists()


def test_no_effect_reasons_measured_on_the_cpu_are_not_claimed_on_cuda(monkeypatch):
    cfg = cert_cfg("model=tiny_moe")
    assert "the CPU splits" in ablation.why_no_effect("batch_invariant_reductions", cfg)
    assert "the CPU adds" in ablation.why_no_effect("moe_combine_order", cfg)
    monkeypatch.setattr(ablation, "resolve_device", lambda name: torch.device("cuda"))
    assert ablation.why_no_effect("batch_invariant_reductions", cfg) is None
    assert ablation.why_no_effect("moe_combine_order", cfg) is None
    assert "no Mamba layer" in ablation.why_no_effect("mamba_chunked_decode", cfg)

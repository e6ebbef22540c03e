"""Every sweep in sweeps/ runs (one tiny step per job); every script in scripts/ works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SWEEPS = sorted(p.stem for p in (REPO / "sweeps").glob("*.yaml"))
TINY = ["rl.steps=1", "rl.prompts_per_step=2", "rl.samples_per_prompt=2"]
QUIET = ["tracking.wandb.mode=disabled", "tracking.progress=false"]


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_runs_every_job(sweep, tmp_path):
    cmd = [sys.executable, "-m", "zkl", "-m", "--config-dir", str(REPO / "sweeps")]
    cmd += ["--config-name", sweep, f"hydra.sweep.dir={tmp_path}", *QUIET, *TINY]
    out = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(jobs) >= 4
    for job in jobs:
        rows = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == 1
    if sweep == "fix_ablation":  # the baseline, then each registered fix off in turn
        from omegaconf import OmegaConf

        from zkl.config import ZklConfig
        from zkl.invariance import FIXES
        from zkl.tracking.run_log import tags

        schema = OmegaConf.structured(ZklConfig)
        cfgs = [
            OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.load(job / "config.yaml")))
            for job in jobs
        ]
        off = [[t for t in tags(cfg) if t.startswith("fix_off:")] for cfg in cfgs]
        assert off == [[]] + [[f"fix_off:{name}"] for name in FIXES]


def test_recompute_metrics_script(tmp_path):
    from conftest import make_cfg

    from zkl.rl.loop import run

    run(make_cfg("zero_train_gen_mismatch=false", "tracking.dump_tokens=all", *TINY), tmp_path)
    script = [sys.executable, str(REPO / "scripts" / "recompute_metrics.py"), str(tmp_path)]
    ok = subprocess.run(script, env=_env(), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    rows = (
        (tmp_path / "metrics.jsonl")
        .read_text()
        .replace('"train/gen_kl_error": ', '"train/gen_kl_error": 1')
    )
    (tmp_path / "metrics.jsonl").write_text(rows)  # tamper: the script must notice
    bad = subprocess.run(script, env=_env(), capture_output=True, text=True)
    assert bad.returncode == 1 and "gen_kl_error" in bad.stdout

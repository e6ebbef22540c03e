"""Every sweep in sweeps/ runs (one tiny step per job); every script in scripts/ works."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from zkl.invariance import FIXES
from zkl.report.runs import discover

pytestmark = pytest.mark.slow  # whole experiments: `pytest -m "not slow"` skips them

REPO = Path(__file__).resolve().parent.parent
SWEEPS = sorted(p.stem for p in (REPO / "sweeps").glob("*.yaml"))
TINY = ["rl.steps=1", "rl.prompts_per_step=2", "rl.samples_per_prompt=2"]
QUIET = ["tracking.wandb.mode=disabled", "tracking.progress=false"]
# Each sweep's documented command runs for real, on fewer points where the sweep is large.
SMALLER = {
    "fix_ablation": ["+precision=mxfp8"],  # still all nine fixes
    "precision_matrix": ["model=tiny_moe"],  # still every arm, precision and kv mode
    "cert_beds": ["cert.steps=2", "cert.models=[tiny_moe]", "cert.precisions=[mxfp8]"],
    "mismatch_treatments": ["+treatment=zero,token_tis,fp16_zero,moe_replay"],  # of 12 arms
}


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


WARM_START = "python -m zkl.lab.warm_start "


def _header_commands(sweep: str) -> list[str]:
    lines = (REPO / "sweeps" / f"{sweep}.yaml").read_text().splitlines()
    return [line.lstrip("# ") for line in lines if line.lstrip("# ").startswith("python -m ")]


def documented_command(sweep: str) -> list[str]:
    """The sweep's command: the first `python -m ...` in its header after any warm start."""
    for line in _header_commands(sweep):
        if not line.startswith(WARM_START):
            return shlex.split(line)
    raise AssertionError(f"sweeps/{sweep}.yaml documents no command")


def warm_starts(sweep: str) -> list[list[str]]:
    """The warm starts the sweep's header makes before it (run here with 2 steps)."""
    return [shlex.split(line) for line in _header_commands(sweep) if line.startswith(WARM_START)]


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_runs_every_job(sweep, tmp_path):
    cmd = documented_command(sweep)
    if "device: cuda" in (REPO / "sweeps" / f"{sweep}.yaml").read_text():
        if not torch.cuda.is_available():
            pytest.skip("a GPU sweep (device: cuda)")
        cmd.append("hydra/launcher=basic")
    assert cmd[:3] in (["python", "-m", "zkl"], ["python", "-m", "zkl.cert"])
    cmd[0] = sys.executable
    cmd[cmd.index("--config-dir") + 1] = str(REPO / "sweeps")
    cmd += [f"hydra.sweep.dir={tmp_path}", *QUIET, *TINY, *SMALLER.get(sweep, [])]
    for warm in warm_starts(sweep):  # into the sweep's working directory, as its header says
        warm = [sys.executable, *warm[1:], "--steps=2", "num_threads=1"]
        made = subprocess.run(warm, cwd=tmp_path, env=_env(), capture_output=True, text=True)
        assert made.returncode == 0, made.stderr[-2000:]
    out = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(jobs) >= 4 or (sweep in SMALLER and len(jobs) >= 2)
    sources = discover([tmp_path])
    assert len(sources.runs) == len(jobs) and all(r.status == "complete" for r in sources.runs)
    steps = 2 if sweep == "cert_beds" else 1  # cert.steps=2: the fewest that certify a refit
    assert all(len(r.rows) == steps for r in sources.runs)
    if sweep == "cert_beds":
        assert len(sources.cert) == len(jobs)
    if sweep == "fix_ablation":
        fixes_off = {r.fixes for r in sources.runs}
        assert fixes_off == {"all_fixes"} | {f"minus_{name}" for name in FIXES}
    if sweep == "precision_matrix":  # zero mode exactly 0; its contrast, zero mode off, not
        arms = {(r.fixes, r.flat["layout.name"]) for r in sources.runs}
        zero, off = "all_fixes", "no_fixes"
        assert arms == {(zero, "colocated"), (zero, "dedicated"), (off, "colocated")}
        for r in sources.runs:
            assert (max(r.series()) == 0.0) == (r.fixes == "all_fixes"), (r.name, r.series())


def _launcher(*overrides: str) -> dict:
    """The resolved hydra.launcher of `python -m zkl <overrides>`."""
    cmd = [sys.executable, "-m", "zkl", "--cfg", "all", "--resolve", *overrides]
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=True)
    return yaml.safe_load(out.stdout)["hydra"]["launcher"]


def test_launcher_presets_compose():
    """slurm and local presets resolve; slurm_gpu asks for the GPUs each layout needs."""
    cases = (("colocated", "auto", 1), ("dedicated", "auto", 1), ("dedicated", "nccl", 2))
    for layout, transport, gpus in cases:
        args = (f"+layout={layout}", f"layout.transport={transport}")
        launcher = _launcher("hydra/launcher=slurm_gpu", *args)
        assert launcher["gpus_per_node"] == gpus, (layout, transport)
    slurm = _launcher("hydra/launcher=slurm", "hydra.launcher.partition=cpu")
    assert slurm["_target_"] == "hydra_plugins.zkl_launchers.SlurmLauncher"
    assert (slurm["partition"], slurm["cpus_per_task"], slurm["max_num_timeout"]) == ("cpu", 1, 24)
    local = _launcher("hydra/launcher=local")
    assert local["_target_"] == "hydra_plugins.zkl_launchers.LocalLauncher"


def test_ablate_group_covers_every_fix():
    names = {p.stem for p in (REPO / "sweeps" / "ablate").glob("*.yaml")}
    assert names == {"none", *FIXES}
    params = (REPO / "sweeps" / "fix_ablation.yaml").read_text()
    assert all(name in params for name in FIXES)


def test_recompute_metrics_script(tmp_path):
    from tests.conftest import make_cfg
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


def test_local_launcher_runs_each_job_in_its_own_directory(tmp_path):
    """hydra/launcher=local: submitit_local, the same jobs without a cluster."""
    cmd = [sys.executable, "-m", "zkl", "-m", "hydra/launcher=local", f"hydra.sweep.dir={tmp_path}"]
    cmd += [*QUIET, *TINY, "kv=recompute,persist"]
    out = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    sources = discover([tmp_path])
    assert sorted(r.name for r in sources.runs) == ["0", "1"]
    assert {r.flat["kv.mode"] for r in sources.runs} == {"recompute", "persist"}
    assert all(r.status == "complete" for r in sources.runs)
    assert (tmp_path / ".submitit").is_dir()


def test_probe_decode_rows_names_the_op_that_breaks_a_row():
    """scripts/probe_decode_rows.py on the CPU: with the attention fix off it traces a batched
    row against its solo run and names attention; in zero mode decode and scoring agree."""
    script = [sys.executable, str(REPO / "scripts" / "probe_decode_rows.py"), "--device", "cpu"]
    tiny = ["--batch", "6", "--new", "4", "--solo", "6", "model=tiny_dense"]
    off = subprocess.run(
        [*script, *tiny, "fixes.attention_fixed_split=false"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    assert '"op": "attention"' in off.stdout, off.stdout
    zero = subprocess.run(
        [*script, *tiny, "--trace", "3", "2"], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert '"mismatching_requests": 0' in zero.stdout and '"equal_calls": 19' in zero.stdout


def test_every_script_and_experiment_the_docs_name_exists():
    """A renamed or removed script leaves no stale command behind: every `scripts/<file>` and
    `python -m zkl.lab.<module>` in the README, docs/ and scripts/ names a file."""
    texts = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "scripts").iterdir()]
    named: set[str] = set()
    for path in texts:
        text = path.read_text()
        named |= set(re.findall(r"\bscripts/[\w.]+\.(?:py|sh)\b", text))
        named |= {"zkl/lab/" + m + ".py" for m in re.findall(r"-m zkl\.lab\.(\w+)", text)}
    assert named, "the pattern finds nothing: the test would pass vacuously"
    assert sorted(n for n in named if not (REPO / n).is_file()) == []
    for script in (REPO / "scripts").glob("*.sh"):  # each runbook at least parses
        subprocess.run(["bash", "-n", str(script)], check=True)

"""What a new user meets first: W&B online, Hydra's own errors, --help, the fix list, Slurm's
requeue cap, and entry points that say what they did. Each case is one sentence, no traceback."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import make_cfg
from zkl import environment, invariance
from zkl.errors import RunFault
from zkl.run.keys import schema_keys
from zkl.run.schema import ZklConfig
from zkl.state import checkpoint
from zkl.state.requeue import submission_note

REPO = Path(__file__).resolve().parent.parent
RUNNER = Path(__file__).resolve().parent / "helpers" / "entry_runner.py"
MARK = "entry_runner: a model was built"
FAST = ["rl.steps=1", "rl.prompts_per_step=2", "rl.samples_per_prompt=2", "tracking.progress=false"]


def entry(module: str, *args: str, env: dict | None = None, cwd: Path | None = None):
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    base |= {"PYTHONPATH": str(REPO), "WANDB_SILENT": "true", **(env or {})}
    return subprocess.run(
        [sys.executable, str(RUNNER), module, *args],
        cwd=cwd or REPO,
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(lines) == 1, lines
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:  # bound then released: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_key_env(tmp_path: Path) -> dict:
    return {
        "HOME": str(tmp_path),
        "NETRC": str(tmp_path / "none"),
        "WANDB_CONFIG_DIR": str(tmp_path),
    }


@pytest.mark.slow
def test_wandb_online_without_a_key_is_refused_before_work(tmp_path):
    run_dir = tmp_path / "run"
    out = entry(
        "zkl", "tracking.wandb.mode=online", f"hydra.run.dir={run_dir}", env=no_key_env(tmp_path)
    )
    assert out.returncode == 2
    line = one_line(out)
    assert "WANDB_API_KEY" in line and "tracking.wandb.mode=offline" in line
    assert MARK not in out.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "tokens.jsonl").exists()


@pytest.mark.slow
def test_wandb_online_unreachable_is_one_sentence_and_leaves_no_logs(tmp_path):
    run_dir = tmp_path / "run"
    env = {"WANDB_API_KEY": "a" * 40, "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}"}
    env |= {"WANDB_INIT_TIMEOUT": "3", **no_key_env(tmp_path)}
    out = entry("zkl", "tracking.wandb.mode=online", *FAST, f"hydra.run.dir={run_dir}", env=env)
    assert out.returncode == 1
    line = one_line(out)
    assert "W&B online could not start" in line and "WANDB_INIT_TIMEOUT=3" in line
    assert MARK not in out.stderr  # before the model
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "tokens.jsonl").exists()


@pytest.mark.slow
def test_wandb_falls_back_to_offline_only_when_asked(tmp_path):
    run_dir = tmp_path / "run"
    out = entry(
        "zkl",
        "tracking.wandb.mode=online",
        "tracking.wandb.fallback=offline",
        *FAST,
        f"hydra.run.dir={run_dir}",
        env=no_key_env(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "logging offline" in out.stderr
    assert list((run_dir / "wandb").glob("offline-run-*"))
    bad = entry("zkl", "tracking.wandb.fallback=maybe", f"hydra.run.dir={tmp_path / 'b'}")
    assert bad.returncode == 2 and "tracking.wandb.fallback" in one_line(bad)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["rl.stepz=2"], "rl.stepz is not a config key; did you mean rl.steps?"),
        (["+rl.stepz=2"], "did you mean rl.steps?"),
        (
            ["model=tiny_dens"],
            "model=tiny_dens is not an option of model; did you mean tiny_dense?",
        ),
        (["precision=mxfp9"], "did you mean mxfp8?"),
        (["+layout=dedicatd"], "did you mean dedicated?"),
        (["-m", "kv=recompute,persistt"], "did you mean persist?"),
        (["rl.steps="], "rl.steps"),  # Hydra's own error, its first line and cause
    ],
)
@pytest.mark.slow
def test_hydras_errors_are_one_sentence(args, expected, tmp_path):
    out = entry("zkl", *args, f"hydra.run.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 2
    assert expected in one_line(out)
    assert MARK not in out.stderr


@pytest.mark.slow
def test_precision_and_layout_with_or_without_plus():
    for plain in (True, False):
        p = "" if plain else "+"
        cfg = make_cfg(f"{p}precision=mxfp8", f"{p}layout=dedicated")
        assert (cfg.precision.linear_quant, cfg.layout.name) == ("mxfp8", "dedicated")
    out = entry("zkl", "precision=fp32", "+layout=dedicated", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    job = OmegaConf.create(out.stdout)
    assert (job.precision.name, job.layout.name) == ("fp32", "dedicated")


@pytest.mark.slow
def test_a_sweep_files_plus_precision_still_works(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "defaults:\n  - config\n  - _self_\nhydra:\n  sweeper:\n    params:\n"
        "      +precision: bf16,fp32\n"
    )
    out = entry(
        "zkl",
        "-m",
        "--config-dir",
        str(tmp_path),
        "--config-name",
        "mine",
        *FAST,
        "tracking.wandb.mode=disabled",
        f"hydra.sweep.dir={tmp_path / 's'}",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    names = {OmegaConf.load(tmp_path / "s" / j / "config.yaml").precision.name for j in "01"}
    assert names == {"bf16", "fp32"}


@pytest.mark.slow
def test_a_failing_multirun_job_is_its_sentence(tmp_path):
    out = entry(
        "zkl", "-m", "rl.steps=0,-1", "tracking.wandb.mode=disabled", f"hydra.sweep.dir={tmp_path}"
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "zkl: rl.steps=0 must be positive." in out.stderr.splitlines()
    assert (tmp_path / "0" / "error.txt").read_text().strip() == "rl.steps=0 must be positive."


def test_help_describes_every_group_and_key():
    out = entry("zkl", "--help")
    assert out.returncode == 0
    for group in ("model", "precision", "layout", "engine", "kv"):
        options = sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))
        assert f"  {group}: {', '.join(options)}" in out.stdout
    leaves = [
        k
        for k in schema_keys(ZklConfig)
        if not any(o.startswith(k + ".") for o in schema_keys(ZklConfig))
    ]
    for key in leaves:
        assert f"  {key}=" in out.stdout, key
    assert "cpu (the embedded default)" in out.stdout  # the field's comment, from the source
    assert "tracking.wandb.fallback=none  # none | offline" in out.stdout


def test_cert_lists_the_fixes_from_the_registry():
    out = entry("zkl.cert", "--list-fixes")
    assert out.returncode == 0
    assert f"{len(invariance.FIXES)} fixes" in out.stdout
    for fix in invariance.FIXES.values():
        assert fix.name in out.stdout and fix.cause in out.stdout


def test_an_offline_wandb_run_ends_saying_where_it_is_and_how_to_sync_it(tmp_path, capsys):
    from zkl.tracking.run_log import RunLog

    log = RunLog(tmp_path, make_cfg("tracking.wandb.mode=offline"))
    log.log(0, {"train/gen_kl_error": 0.0})
    log.close()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    said = [line for line in capsys.readouterr().err.splitlines() if "wandb sync" in line]
    assert said == [f"zkl: W&B logged offline to {run}; upload it with: wandb sync {run}"]


def test_bench_says_where_it_wrote(tmp_path, capsys):
    from zkl.lab.bench import say, write_result

    say("round 1/5 done")
    write_result({"threads": 1, "zero/gen_tokens_per_s": 2.5}, tmp_path)
    captured = capsys.readouterr()
    assert "zkl.bench: round 1/5 done" in captured.err
    assert f"results: {tmp_path / 'bench.json'}" in captured.out


def test_slurm_submission_says_how_long_a_job_may_run():
    launcher = {"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"}
    cfg = OmegaConf.create(
        {"hydra": {"launcher": launcher | {"timeout_min": 60, "max_num_timeout": 24}}}
    )
    note = submission_note(cfg)
    assert "25 hours" in note and "hydra.launcher.max_num_timeout=24" in note
    local = OmegaConf.create({"hydra": {"launcher": {"_target_": "x.BasicLauncher"}}})
    assert submission_note(local) is None
    preset = OmegaConf.load(REPO / "conf" / "hydra" / "launcher" / "slurm.yaml")
    assert preset.max_num_timeout * preset.timeout_min >= 24 * 60  # a day, not 4 hours


class _Log:
    wandb_id = None
    closed = 0

    def close(self) -> None:
        self.closed += 1


def test_requeue_cap_is_a_run_fault_not_a_failed_step(tmp_path, capsys):
    """submitit's handler refuses to requeue (too many time-outs): a RunFault naming the keys,
    W&B finished first, and no 'the step in flight failed' (no step failed)."""

    class UncompletedJobError(RuntimeError):
        pass

    def submitit_handler(signum, frame):
        raise UncompletedJobError("Job not requeued because: timed-out too many times.")

    sig = environment.preempt_signal()
    previous = signal.signal(sig, submitit_handler)
    cfg = make_cfg("rl.steps=5", "checkpoint.save=false")
    log = _Log()
    try:
        with (
            pytest.raises(RunFault) as err,
            checkpoint.Saver(cfg, tmp_path, policy=None, log=log) as saver,
        ):
            os.kill(os.getpid(), sig)
            saver.after_step(2)
    finally:
        signal.signal(sig, previous)
    message = str(err.value)
    assert "timed-out too many times" in message and "hydra.launcher.max_num_timeout" in message
    assert "steps 0-2 of 5" in message and "resume=true" in message
    assert log.closed == 1  # W&B finished before the handler ran
    assert "step in flight failed" not in capsys.readouterr().err


def test_schema_field_comments_reach_help():
    from zkl.help import field_comments

    comments = field_comments(dataclasses.make_dataclass("X", []))
    assert comments == {}
    assert "recompute | persist" in field_comments(type(make_cfg().kv)).get("mode", "")

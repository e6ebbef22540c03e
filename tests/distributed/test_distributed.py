"""FSDP2-sharded training with one generator per rank, on the CPU (gloo), spawned ranks.

`run(cfg)` with `trainer.world_size=N` starts the N ranks itself (zkl/distributed/launch.py);
rank 0 writes the run's logs. Every sharded run must be exactly zero at every step, its
update must change the weights the generators get, and its step 0 (the initial weights)
must be, token for token and bit for bit, world size 1's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from tests.conftest import make_cfg
from tests.rl.test_rl import _without_timing as rows_without_timing
from tests.state.test_resume import without_timing
from tests.test_faults import finish, start, wait_for_step
from zkl.errors import ConfigError
from zkl.rl.loop import run
from zkl.run.validate import check_run
from zkl.state.config import CHECKPOINT_FILE
from zkl.state.sharded import SHARDS_DIR
from zkl.tracking.run_log import TOKENS_FILE, read_metrics

pytestmark = pytest.mark.slow  # whole experiments: `pytest -m "not slow"` skips them

warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
REPO = Path(__file__).resolve().parents[2]
BASE = ["num_threads=1", "rl.prompts_per_step=4", "rl.samples_per_prompt=4"]
BASE += ["tracking.dump_tokens=all", "checkpoint.save=false"]


def _tokens(run_dir, step: int) -> list[dict]:
    lines = (run_dir / TOKENS_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["step"] == step]


def _steady(row: dict) -> dict:
    """A row's numbers that world size 1 and N share at step 0 (not timing or engine counts)."""
    keep = ("train/", "reward/", "rl/", "gen/response", "gen/weight_version")
    return {k: v for k, v in row.items() if k.startswith(keep)}


def _check_sharded_run(tmp_path, model: str, layout: str, world_size: int, steps: int) -> None:
    common = [f"model={model}", f"+layout={layout}", *BASE]
    sharded = tmp_path / f"ws{world_size}"
    rows = run(make_cfg(*common, f"rl.steps={steps}", f"trainer.world_size={world_size}"), sharded)
    assert [r["step"] for r in rows] == list(range(steps))
    for r in rows:
        assert r["train/max_abs_logprob_diff"] == 0.0 and r["train/gen_kl_error"] == 0.0, r
        assert r["train/bitwise_equal_frac"] == 1.0
        assert r["weights/changed_tensors"] > 0, r
        assert r["gen/weight_version"] == r["step"]  # every rollout after a refit used it
    single = tmp_path / "ws1"
    (one,) = run(make_cfg(*common, "rl.steps=1"), single)
    assert _steady(rows[0]) == _steady(one)
    assert _tokens(sharded, 0) == _tokens(single, 0)  # prompts, tokens, lp_gen, lp_train


def test_world_size_2_dense_colocated_20_steps(tmp_path):
    _check_sharded_run(tmp_path, "tiny_dense", "colocated", 2, 20)


def test_world_size_2_moe_colocated(tmp_path):
    _check_sharded_run(tmp_path, "tiny_moe", "colocated", 2, 3)


def test_world_size_2_dense_dedicated(tmp_path):
    _check_sharded_run(tmp_path, "tiny_dense", "dedicated", 2, 3)


def test_world_size_4_dense_colocated(tmp_path):
    _check_sharded_run(tmp_path, "tiny_dense", "colocated", 4, 2)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "layout", "world_size"),
    [
        (m, lay, ws)
        for m in ("tiny_dense", "tiny_moe")
        for lay in ("colocated", "dedicated")
        for ws in (2, 4)
    ],  # fmt: skip
)
def test_sharded_20_steps(tmp_path, model, layout, world_size):
    _check_sharded_run(tmp_path, model, layout, world_size, 20)


def test_sharded_and_dedicated_agree_bitwise(tmp_path):
    """The layout changes no bit of a sharded run: colocated and dedicated rows are equal."""
    common = ["model=tiny_moe", "rl.steps=2", "trainer.world_size=2", *BASE]
    a = run(make_cfg(*common, "+layout=colocated"), tmp_path / "c")
    b = run(make_cfg(*common, "+layout=dedicated"), tmp_path / "d")
    assert rows_without_timing(a) == rows_without_timing(b)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["trainer.world_size=0"], "trainer.world_size=0"),
        (["trainer.world_size=32"], "trainer.world_size=32"),
        (["trainer.world_size=2", "rl.num_minibatches=16"], "rl.num_minibatches"),
        (["trainer.world_size=2", "trainer.process_group=nccl"], "trainer.process_group=nccl"),
        (["trainer.world_size=2", "trainer.heartbeat_s=0"], "trainer.heartbeat_s"),
    ],
)
def test_refusals_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_run(make_cfg(*BASE, *overrides))


def test_launcher_world_size_must_match(tmp_path, monkeypatch):
    """torchrun (or Slurm) started 2 ranks, the config says 1: one sentence, no hang."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"set trainer\.world_size=2"):
        run(make_cfg(*BASE, "rl.steps=1"), tmp_path)


def _ranks(parent: int, count: int, deadline_s: float = 120) -> list[int]:
    """The pids of the spawned ranks of `parent`, in rank order (they start in that order)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = []
        for entry in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in cmdline:
                found.append(int(entry))
        if len(found) == count:
            return sorted(found)
        time.sleep(0.05)
    raise AssertionError("the ranks never started")


@pytest.mark.parametrize("victim", [1, 0])
def test_rank_killed_mid_run_is_reported_by_every_other_rank(tmp_path, victim):
    """No rank hangs on a collective with a dead peer: each survivor names it within
    seconds and stops; the launcher names the rank and its signal; logged steps stay."""
    run_dir = tmp_path / "run"
    proc = start(["trainer.world_size=3", "rl.steps=500", "num_threads=1"], run_dir)
    pids = _ranks(proc.pid, 3)
    wait_for_step(proc, run_dir)
    os.kill(pids[victim], signal.SIGKILL)
    lines, seconds = finish(proc, time.monotonic())
    assert proc.returncode == 1 and seconds < 20, (seconds, lines)
    gone = f"rank {victim} stopped answering" if victim else "rank 0, which holds the rendezvous"
    for rank in {0, 1, 2} - {victim}:
        assert any(x.startswith(f"zkl: rank {rank} of 3: {gone}") for x in lines), lines
    ours = [x for x in lines if x.startswith("zkl: ")]  # (multiprocessing's resource
    # tracker may add a warning about the killed rank's semaphores after them)
    assert ours[-1] == f"zkl: rank {victim} of 3 was killed by signal SIGKILL", lines
    assert not any("Traceback" in x for x in lines), lines
    assert len(read_metrics(run_dir)) >= 1


RESUME = ["trainer.world_size=2", "num_threads=1", "rl.prompts_per_step=2"]
RESUME += ["rl.samples_per_prompt=2", "tracking.dump_tokens=all", "model=tiny_moe"]


@pytest.fixture(scope="module")
def sharded_reference(tmp_path_factory) -> Path:
    """An uninterrupted 5-step run at world size 2."""
    run_dir = tmp_path_factory.mktemp("reference")
    run(make_cfg("rl.steps=5", "checkpoint.save=false", *RESUME), run_dir)
    return run_dir


def _assert_same_run(run_dir: Path, reference: Path) -> None:
    assert without_timing(run_dir / "metrics.jsonl") == without_timing(reference / "metrics.jsonl")
    assert (run_dir / TOKENS_FILE).read_text() == (reference / TOKENS_FILE).read_text()


def test_sharded_checkpoint_resumes_bitwise(sharded_reference, tmp_path):
    """3 steps, a sharded checkpoint (each rank's shards, torch.distributed.checkpoint),
    `resume=true` to 5: the rows and tokens of the uninterrupted run."""
    run(make_cfg("rl.steps=3", "checkpoint.every=2", *RESUME), tmp_path)
    meta = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    assert meta["step"] == 3 and meta["world_size"] == 2 and "policy" not in meta
    shards = tmp_path / meta["shards"]
    assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert [p.name for p in (tmp_path / SHARDS_DIR).iterdir()] == [shards.name]  # older gone
    rows = run(make_cfg("rl.steps=5", "resume=true", *RESUME), tmp_path)
    assert [r["step"] for r in rows] == list(range(5))
    _assert_same_run(tmp_path, sharded_reference)
    with pytest.raises(ConfigError, match=r"trainer\.world_size was 2, now 1"):
        run(make_cfg("rl.steps=6", "resume=true", *RESUME, "trainer.world_size=1"), tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_saves_sharded_checkpoint_and_resumes(sharded_reference, tmp_path, sig):
    """SIGTERM to the launcher reaches every rank; so does a terminal's Ctrl-C (to the whole
    process group: each rank gets it, and SIGTERM from the launcher). They finish the step
    together, save their shards and exit 143 (130); the resumed run equals the uninterrupted
    one."""
    extra = [x for x in RESUME if not x.startswith(("rl.prompts", "rl.samples"))]  # in start()
    proc = start([*extra, "rl.steps=5", "checkpoint.every=100"], tmp_path / "run")
    run_dir = tmp_path / "run"
    wait_for_step(proc, run_dir)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    logged = len(read_metrics(run_dir))
    meta = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
    assert meta["step"] == logged < 5 and (run_dir / meta["shards"]).is_dir()
    rows = run(make_cfg("rl.steps=5", "resume=true", *RESUME), run_dir)
    assert [r["step"] for r in rows] == list(range(5))
    _assert_same_run(run_dir, sharded_reference)


def test_cert_certifies_a_bed_at_world_size_2(tmp_path):
    """`python -m zkl.cert trainer.world_size=2 cert.steps=3`: a PASS row for the ws2 bed;
    the one-process step-0 certification refuses world size 2, naming cert.steps."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "zkl.cert", "trainer.world_size=2", "num_threads=1"]
    cmd += ["rl.prompts_per_step=4", "rl.samples_per_prompt=4", f"hydra.run.dir={tmp_path}"]
    out = subprocess.run([*cmd, "cert.steps=3"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = [json.loads(x) for x in (tmp_path / "cert.jsonl").read_text().splitlines()]
    assert row["bed"] == "tiny_dense/colocated/bf16/kv_recompute/ws2" and row["result"] == "PASS"
    assert row["train/max_abs_logprob_diff"] == 0.0 and row["steps"] == 3 and row["passed"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "cert.steps=N" in refused.stderr


def test_memory_estimate_knows_the_sharding():
    """Per rank: 1/8 of the masters, gradients and AdamW state, the whole generator; the
    refusal of a model too large for one process names trainer.world_size."""
    from dataclasses import replace

    from zkl.memory import check_memory, estimate, param_count

    cfg = make_cfg("model=qwen3_30b_a3b", "task.name=residue")
    one = estimate(replace(cfg, device="cuda:0"), 86)
    eight = estimate(replace(make_cfg("model=qwen3_30b_a3b", "task.name=residue",
                                      "trainer.world_size=8"), device="cuda:0"), 86)  # fmt: skip
    p = param_count(cfg.model)
    assert one["weights and optimizer state"] == 20 * p
    assert eight["generator weights"] == 2 * p
    assert 16 * p / 8 < eight["weights and optimizer state"] < 16 * p / 8 + 0.1 * 16 * p
    with pytest.raises(ConfigError, match=r"raise trainer\.world_size"):
        check_memory(cfg, 86)


def test_world_size_1_through_the_fsdp_path(tmp_path):
    """trainer.fsdp=true at world size 1 (a group of one): zero, trained, step 0 equal to the
    single-process run; the group's environment is gone after it (a later run spawns)."""
    common = ["model=tiny_moe", *BASE]
    rows = run(make_cfg(*common, "rl.steps=3", "trainer.fsdp=true"), tmp_path / "fsdp")
    for r in rows:
        assert r["train/max_abs_logprob_diff"] == 0.0 and r["weights/changed_tensors"] > 0
    (one,) = run(make_cfg(*common, "rl.steps=1"), tmp_path / "one")
    assert _steady(rows[0]) == _steady(one)
    assert "WORLD_SIZE" not in os.environ


def test_a_sharded_run_replaces_the_group_of_one_a_library_made(tmp_path):
    """megatron-core's parallel state needs a default group, and zkl makes one of this process
    alone for it (`ranks.group_of_one`); a sharded run later in the same process replaces it,
    while a default group zkl did not make is refused in one sentence before any work."""
    import torch.distributed as dist

    from zkl.distributed import ranks

    cfg = make_cfg("model=tiny_dense", *BASE, "rl.steps=1", "trainer.fsdp=true")
    ranks.group_of_one()
    try:
        (row,) = run(cfg, tmp_path / "after_one")
        assert row["train/max_abs_logprob_diff"] == 0.0 and not dist.is_initialized()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        with pytest.raises(ConfigError, match=r"did not create.*trainer\.fsdp=false"):
            run(cfg, tmp_path / "foreign")
        assert not (tmp_path / "foreign" / "metrics.jsonl").exists()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_spawned_ranks_leave_no_semaphore_behind(tmp_path):
    """Each spawned rank runs multiprocessing's finalizers before it skips the C++ teardown,
    so the semaphores it made (tqdm's lock) are unlinked and the spawner's resource tracker
    has nothing to warn about."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "zkl", "trainer.world_size=2", "rl.steps=2", *BASE]
    out = subprocess.run(
        [*cmd, f"hydra.run.dir={tmp_path}"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 steps in" in out.stdout
    assert "resource_tracker" not in out.stderr and "leaked" not in out.stderr, out.stderr[-3000:]

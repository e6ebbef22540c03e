"""`resume=true` without `hydra.run.dir`: the latest run of the same config among the folders
the run-dir pattern matches, or one sentence naming the folders it considered."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from zkl.errors import ConfigError
from zkl.state.latest_run import HYDRA_CONFIG, folder_glob, latest_run
from zkl.state.run_lock import LOCK_FILE

PATTERN = "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}"  # Hydra's default hydra.run.dir
CONFIG = {
    "rl": {"steps": 20, "lr": 0.01, "betas": [0.9, 0.999]},
    "checkpoint": {"every": 10, "save": True},
    "tracking": {"progress": True, "dump_tokens": "4", "wandb": {"mode": "offline"}},
    "model": {"name": "tiny_dense", "checkpoint": None},
    "resume": False,
    "seed": 0,
}


def _with(**changes) -> dict:
    config = OmegaConf.create(CONFIG)
    for key, value in changes.items():
        OmegaConf.update(config, key.replace("__", "."), value)
    return OmegaConf.to_container(config)


def make_run(root: Path, name: str, config: dict | None, checkpoint: bool, age_s: float) -> Path:
    """A folder as a Hydra run leaves it; its checkpoint saved `age_s` seconds ago."""
    folder = root / "outputs" / "2026-01-01" / name
    folder.mkdir(parents=True)
    if config is not None:
        (folder / HYDRA_CONFIG).parent.mkdir()
        (folder / HYDRA_CONFIG).write_text(OmegaConf.to_yaml(config))
    if checkpoint:
        path = folder / "checkpoint.pt"
        path.write_bytes(b"")
        stamp = time.time() - age_s
        os.utime(path, (stamp, stamp))
    return folder


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # Hydra's run dir is relative to where zkl is started
    return tmp_path


def test_the_pattern_is_a_glob_and_a_fixed_folder_is_none():
    assert folder_glob(PATTERN) == "outputs/*/*"
    assert folder_glob("/runs/a") is None


def test_the_latest_checkpoint_of_the_same_config_wins(root):
    make_run(root, "old", CONFIG, checkpoint=True, age_s=300)
    # keys a resume may change (rl.steps, checkpoint.*, tracking.progress/wandb, resume) differ
    changed = _with(rl__steps=5, checkpoint__every=1, tracking__progress=False, resume=True)
    newer = make_run(root, "newer", changed, checkpoint=True, age_s=100)
    make_run(root, "newest_other", _with(rl__lr=0.02), checkpoint=True, age_s=10)
    make_run(root, "unsaved", CONFIG, checkpoint=False, age_s=0)
    now = _with(rl__steps=40, resume=True)
    assert latest_run(PATTERN, now) == Path("outputs/2026-01-01/newer") == newer.relative_to(root)


def test_no_run_to_continue_is_one_sentence_naming_each_folder_and_why(root):
    make_run(root, "a_other", _with(rl__lr=0.02), checkpoint=True, age_s=30)
    make_run(root, "b_other", _with(tracking__dump_tokens="all"), checkpoint=True, age_s=20)
    make_run(root, "c_unsaved", CONFIG, checkpoint=False, age_s=0)
    make_run(root, "d_bare", None, checkpoint=True, age_s=10)
    with pytest.raises(ConfigError) as err:
        latest_run(PATTERN, CONFIG)
    assert str(err.value) == (
        "resume=true found no run of this config to continue among the 4 folders matching "
        "outputs/*/* (outputs/2026-01-01/d_bare: no readable .hydra/config.yaml; "
        "outputs/2026-01-01/b_other: another config (tracking.dump_tokens was 'all', now '4'); "
        "outputs/2026-01-01/a_other: another config (rl.lr was 0.02, now 0.01); "
        "outputs/2026-01-01/c_unsaved: no checkpoint.pt); pass hydra.run.dir=DIR of the run "
        "to continue, or drop resume=true to start afresh."
    )


def test_many_folders_are_counted_past_five(root):
    for i in range(8):
        make_run(root, f"r{i}", _with(seed=i + 1), checkpoint=True, age_s=i)
    with pytest.raises(
        ConfigError,
        match=r"among the 8 folders .*r4: another config \(seed "
        r"was 5, now 0\); and 3 more\); pass hydra.run.dir",
    ):
        latest_run(PATTERN, CONFIG)


def test_nothing_matches(root):
    with pytest.raises(ConfigError, match=r"continue in outputs/\*/\* \(no folder matches it\)"):
        latest_run(PATTERN, CONFIG)


def test_a_run_held_by_a_live_process_is_passed_over(root):
    older = make_run(root, "older", CONFIG, checkpoint=True, age_s=100)
    live = make_run(root, "live", CONFIG, checkpoint=True, age_s=1)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(live / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert latest_run(PATTERN, CONFIG) == older.relative_to(root)
        older.joinpath("checkpoint.pt").unlink()
        with pytest.raises(ConfigError, match=r"live: in use by a live run; .*older: no chec"):
            latest_run(PATTERN, CONFIG)
    finally:
        holder.kill()
        holder.wait()

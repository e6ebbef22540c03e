"""A key's old name (`zkl.renamed`) keeps working where keys are typed, with one line saying
what it is now; a config saved under old names reads back under the new ones; a YAML file
that still holds an old name is refused in one sentence naming the new key."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import make_cfg
from zkl.errors import ConfigError
from zkl.renamed import RENAMED, read_back
from zkl.run.compose import compose, to_object
from zkl.run.keys import schema_keys
from zkl.run.overrides import normalize, normalize_sweep_params, renames
from zkl.run.register import compose_dict
from zkl.run.schema import ZklConfig

REPO = Path(__file__).resolve().parents[2]
SAVED = REPO / "tests" / "testdata" / "treatments_sweep" / "10" / "config.yaml"  # an older zkl's


def test_each_new_name_is_a_key_and_no_old_name_is():
    keys = set(schema_keys(ZklConfig))
    assert set(RENAMED.values()) <= keys
    assert not set(RENAMED) & keys


def _other_value(key: str) -> str:
    """An override value for `key` that differs from its default."""
    value = OmegaConf.select(OmegaConf.structured(ZklConfig), key)
    if isinstance(value, bool):
        return str(not value).lower()
    if isinstance(value, int | float):
        return str(value * 2 + 3)
    if OmegaConf.is_list(value):
        return "[1]"
    return "changed"


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_key_on_the_command_line_sets_its_new_key(old):
    """`old=v` and `+old=v` compose to the config `new=v` does, and one sentence says so."""
    new, value = RENAMED[old], _other_value(RENAMED[old])
    want = compose([f"{new}={value}"])
    assert want != compose([])  # the value changes the config: the comparison can fail
    for line in (f"{old}={value}", f"+{old}={value}"):
        assert compose([line]) == want, line
        (said,) = renames([line])
        assert said == f"{old} is now {new}: {line} runs as {new}={value}.", said
    assert renames([f"{new}={value}", "rl.steps=2"]) == []


def test_a_sweeps_params_may_name_old_keys():
    params = {"engine.max_batch_size": "2,4", "+precision": "bf16,fp32", "rl.steps": "1"}
    normalized, said = normalize_sweep_params(params)
    assert normalized == {
        "scheduler.max_batch_size": "2,4",
        "precision": "bf16,fp32",
        "rl.steps": "1",
    }
    assert said == [
        "engine.max_batch_size is now scheduler.max_batch_size: the sweep's "
        "engine.max_batch_size runs as scheduler.max_batch_size."
    ]
    assert normalize(["-m", "--config-dir", "x", "engine.backend=a,b"]) == [
        "-m",
        "--config-dir",
        "x",
        "engine.name=a,b",
    ]


def test_a_config_saved_under_old_names_reads_back_under_the_new_ones():
    """An older zkl's config.yaml (moe and engine keys flat) holds, read back, only keys of
    today's schema, with the saved values."""
    saved = OmegaConf.to_container(OmegaConf.load(SAVED))
    assert "backend" in saved["engine"] and "num_experts" in saved["model"]
    now = read_back(saved)
    merged = OmegaConf.merge(OmegaConf.structured(ZklConfig), now)  # refuses an unknown key
    assert merged.engine.name == saved["engine"]["backend"]
    assert merged.scheduler.max_batch_size == saved["engine"]["max_batch_size"]
    assert merged.model.moe.num_experts == saved["model"]["num_experts"] > 0
    assert merged.model.rope.theta == saved["model"]["rope_theta"]
    hybrid = {"model": {"num_experts": 0, "n_routed_experts": 8, "n_groups": 2, "n_group": 1}}
    assert read_back(hybrid)["model"] == {
        "moe": {"num_experts": 8, "num_expert_groups": 1},
        "mamba": {"num_groups": 2},
    }
    sinks = {"model": {"attention_sinks": True, "rope_type": "default", "yarn_factor": 4.0}}
    assert read_back(sinks)["model"]["rope"] == {"type": "yarn", "factor": 4.0}
    plain = {"model": {"rope_factor": 8.0, "yarn_factor": 1.0, "yarn_truncate": False}}
    assert read_back(plain)["model"] == {"rope": {"factor": 8.0}}  # YaRN's keys were unread


def test_an_old_key_forced_into_a_composition_is_refused_naming_the_new_one():
    with pytest.raises(ConfigError) as err:
        to_object(compose_dict(["+engine.backend=native"]), [])
    assert str(err.value) == "engine.backend is not a config key; it is now engine.name."


def test_edits_of_a_section_keep_their_own_keys_in_a_bed():
    """A cert bed of another model keeps the user's edit of one section key, not the whole
    section of the model it was made on."""
    from zkl.run.compose import with_group_option

    cfg = make_cfg("model=tiny_moe", "model.moe.norm_topk_prob=false")
    bed = with_group_option(cfg, "model", "tiny_gpt_oss")
    stock = make_cfg("model=tiny_gpt_oss").model
    assert bed.model == dataclasses.replace(
        stock, moe=dataclasses.replace(stock.moe, norm_topk_prob=False)
    )


@pytest.mark.slow
def test_the_entry_point_runs_old_keys_and_refuses_them_in_a_file(tmp_path):
    run = [sys.executable, "-m", "zkl", "engine.backend=native", "engine.max_batch_size=4"]
    out = subprocess.run([*run, "--cfg", "job"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    job = OmegaConf.create(out.stdout)
    assert (job.engine.name, job.scheduler.max_batch_size) == ("native", 4)
    lines = out.stderr.strip().splitlines()
    assert lines == [
        "zkl: engine.backend is now engine.name: engine.backend=native runs as engine.name=native.",
        "zkl: engine.max_batch_size is now scheduler.max_batch_size: engine.max_batch_size=4 "
        "runs as scheduler.max_batch_size=4.",
    ]
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "mine.yaml").write_text("backend: native\n")
    cmd = [sys.executable, "-m", "zkl", "--config-dir", str(tmp_path), "engine=mine"]
    out = subprocess.run([*cmd, "--cfg", "job"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "zkl: In 'engine/mine': engine.backend is not a config key; it is now engine.name."
    )

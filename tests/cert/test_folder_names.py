"""Folder names built from config values cannot leave the run directory: refused, one sentence."""

from __future__ import annotations

import os

import pytest

from tests.conftest import cert_cfg
from tests.test_hostile_input import assert_refused_before_work, run_entry
from zkl.cert.beds import bed_dir, folder_name, plan
from zkl.errors import ConfigError

BAD = ["../../../x", "..", "/tmp/abs", "a/b", "a b", ".hidden", "x\n", "é", "a\\b", "", "x" * 201]


@pytest.mark.parametrize("value", BAD)
def test_a_bad_folder_name_is_refused(value):
    with pytest.raises(ConfigError, match=r"^model.name=.* names a folder .*; change model.name"):
        folder_name(value, "model.name")


@pytest.mark.parametrize("value", ["qwen3-0.6b", "tiny_dense", "mx+fp8=v2", "A1"])
def test_plain_names_pass(value):
    assert folder_name(value, "model.name") == value


@pytest.mark.parametrize("key", ["model.name", "precision.name", "layout.name"])
@pytest.mark.parametrize("value", ["../../../x", "/tmp/abs"])
def test_a_bed_named_by_a_bad_value_is_refused_in_the_plan(key, value):
    with pytest.raises(ConfigError, match=rf"^{key}="):
        plan(cert_cfg(f"{key}={value}"))


@pytest.mark.parametrize("axis", ["models", "precisions", "layouts", "kv"])
def test_a_bed_option_that_is_a_path_is_refused(axis):
    with pytest.raises(ConfigError, match=rf"^cert.{axis}='../precision/bf16' names a folder"):
        plan(cert_cfg(f"cert.{axis}=[../precision/bf16]"))


def test_every_bed_folder_lies_inside_the_run_directory(tmp_path):
    runs = plan(cert_cfg("cert.models=[tiny_dense,tiny_moe]", "cert.kv=[recompute,persist]"))
    for run in runs:
        path = bed_dir(tmp_path, run)
        assert path.resolve().is_relative_to(tmp_path.resolve()) and ".." not in path.parts


@pytest.mark.parametrize("value", ["../../../escaped", "/tmp/zkl-escaped-bed"])
@pytest.mark.slow
def test_cert_writes_nothing_outside_its_run_directory(tmp_path, value):
    """The entry point: exit 2 before any work, nothing next to or above the run directory."""
    root = tmp_path / "a" / "b"
    root.mkdir(parents=True)
    run_dir = root / "run"
    before = set(os.listdir(tmp_path))
    out = run_entry("zkl.cert", ["cert.steps=2", f"model.name={value}"], run_dir)
    assert_refused_before_work(out, run_dir, "model.name")
    assert set(os.listdir(tmp_path)) == before and os.listdir(root) == ["run"]
    assert not os.path.exists("/tmp/zkl-escaped-bed")

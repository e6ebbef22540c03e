"""The run's config as its parts own it: the schema composed without side effects, the fixes
group generated from the registry, renamed keys refused, CUDA graphs decided by one rule."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import fake_gpus, make_cfg
from zkl import invariance
from zkl.errors import ConfigError
from zkl.generation.graphs import graph_unsupported_reason, graphs_on
from zkl.run.validate import check_run, validate

REPO = Path(__file__).resolve().parents[2]
CUDA = torch.device("cuda", 0)


@pytest.fixture
def one_gpu(monkeypatch):
    """torch.cuda reporting one idle device (nothing here touches a real one)."""
    fake_gpus(monkeypatch, 1)


def test_fixes_config_has_one_key_per_registered_fix():
    keys = [f.name for f in dataclasses.fields(invariance.FixesConfig)]
    assert keys == list(invariance.FIXES)
    assert all(value is None for value in vars(invariance.FixesConfig()).values())
    assert set(vars(make_cfg().fixes)) == set(invariance.FIXES)
    assert invariance.from_config(make_cfg("fixes.logprob_path=false")) == (
        frozenset(invariance.FIXES) - {"logprob_path"}
    )


def test_importing_the_schema_registers_nothing_in_hydra():
    code = (
        "from hydra.core.config_store import ConfigStore\n"
        "from omegaconf import OmegaConf\n"
        "import zkl.run.schema, zkl.run.validate, zkl.run.compose, zkl.tracking.errors\n"
        "import zkl.run.register, zkl.run.checks\n"
        "import zkl.cli, zkl.help, zkl.run.overrides\n"
        "names = ConfigStore.instance().list('')\n"
        "assert 'zkl_schema.yaml' not in names, names\n"
        "assert not OmegaConf.has_resolver('zkl_gpus')\n"
        "assert not OmegaConf.has_resolver('zkl_tasks_per_node')\n"
        "zkl.run.register.register()\n"
        "assert 'zkl_schema.yaml' in ConfigStore.instance().list('')\n"
        "assert OmegaConf.has_resolver('zkl_gpus')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize(
    ("model", "precision", "extra", "reason"),
    [
        ("tiny_moe", "mxfp8", [], "MoE layers under a quantizing precision recipe"),
        ("tiny_hybrid", "mxfp8", [], "MoE layers under a quantizing precision recipe"),
    ],
)
def test_cuda_graphs_on_that_cannot_work_is_refused_before_work(
    model, precision, extra, reason, one_gpu
):
    cfg = make_cfg(
        f"model={model}",
        f"+precision={precision}",
        "device=cuda",
        "scheduler.cuda_graphs=on",
        *extra,
    )
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    message = str(err.value)
    assert message.startswith(f"scheduler.cuda_graphs=on cannot work with model={model}: {reason}")
    assert message.endswith("use scheduler.cuda_graphs=auto or off.") and "\n" not in message
    with pytest.raises(ConfigError, match="scheduler.cuda_graphs=on cannot work"):
        check_run(cfg)  # the entry's check: refused before any run directory or model
    validate(make_cfg(f"model={model}", "device=cuda"))  # auto: eager decode, no refusal


def test_a_dense_model_on_cuda_decodes_in_graphs_by_default(one_gpu):
    """`python -m zkl device=cuda model=qwen2_5_1_5b task.name=residue`: graphs, no extra key."""
    cfg = make_cfg("device=cuda", "model=qwen2_5_1_5b", "task.name=residue")
    assert cfg.scheduler.cuda_graphs == "auto"
    assert graph_unsupported_reason(cfg.model, CUDA) is None
    assert graphs_on(cfg.scheduler.cuda_graphs, cfg.model, CUDA)
    assert not graphs_on("off", cfg.model, CUDA)
    assert not graphs_on("auto", cfg.model, torch.device("cpu"))  # the CPU decodes eagerly
    moe = make_cfg("model=tiny_moe").model
    assert graphs_on("auto", moe, CUDA)  # experts grouped on the device: capturable
    validate(make_cfg("model=tiny_moe", "device=cuda", "scheduler.cuda_graphs=on"))
    assert not graphs_on("auto", moe, CUDA, quantized=True)
    with pytest.raises(ValueError, match="scheduler.cuda_graphs=on cannot work here: MoE"):
        graphs_on("on", moe, CUDA, quantized=True)

"""The last hostile command lines, each one sentence before any work (exit 2), and a refused
run's error.txt.

Categories: model numbers a later stage divides by or clamps with (every int and float of
`ModelConfig`, for every tiny family), overrides Hydra's grammar cannot read, values of the
wrong type, a group given twice. The command line is checked before torch loads.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import make_cfg
from zkl.errors import ConfigError
from zkl.models.build import build_model
from zkl.models.config import AT_LEAST_ONE, leaves, replaced, value_at
from zkl.run.overrides import preflight
from zkl.run.validate import validate
from zkl.tracking.errors import read_error

REPO = Path(__file__).resolve().parent.parent
FAMILIES = ("tiny_dense", "tiny_moe", "tiny_hybrid")
INTS = [key for key, f in leaves() if f.type == "int"]
FLOATS = [key for key, f in leaves() if f.type == "float"]


def refused(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    message = str(err.value)
    assert "\n" not in message
    return message


def with_model(cfg, **changes):
    """`cfg` with model keys changed, a section's by its dotted key (`**{"moe.x": v}`)."""
    return dataclasses.replace(cfg, model=replaced(cfg.model, changes))


def test_the_reported_model_numbers_are_refused():
    hybrid = make_cfg("model=tiny_hybrid")
    for key, value in [
        ("moe.num_expert_groups", 0),
        ("mamba.time_step_min", 0.0),
        ("mamba.time_step_min", -1.0),
    ]:
        message = refused(with_model(hybrid, **{key: value}))
        assert message.startswith(f"model.{key}={value} must be positive"), message
    message = refused(with_model(hybrid, **{"moe.routed_scaling_factor": 0.0}))
    assert message.startswith("model.moe.routed_scaling_factor=0.0 must be positive")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_model_float_must_be_positive(family):
    base = make_cfg(f"model={family}")
    for key in FLOATS:
        for value in (0.0, -1.0):
            assert refused(with_model(base, **{key: value})).startswith(f"model.{key}="), key


@pytest.mark.parametrize("family", FAMILIES)
def test_every_model_count_is_refused_below_its_floor(family):
    base = make_cfg(f"model={family}")
    for key in INTS:
        assert f"model.{key}=-1" in refused(with_model(base, **{key: -1})), key
    for key in AT_LEAST_ONE:
        assert f"model.{key}=0" in refused(with_model(base, **{key: 0})), key


@pytest.mark.slow  # a model built for each number that passes: ~20 s a family here
@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_number_passes_only_if_the_model_runs(family):
    """Every int and float of the model at 0, -1 and 3: refused naming a model key, or the
    model builds and its forward is finite (no ZeroDivisionError, no silent NaN)."""
    base = make_cfg(f"model={family}")
    for key in INTS + FLOATS:
        kind = type(value_at(base.model, key))
        for value in (0, -1, 3):
            cfg = with_model(base, **{key: kind(value)})
            try:
                validate(cfg)
            except ConfigError as err:
                assert str(err).startswith("model."), (key, value, err)
                continue
            model = build_model(cfg.model, torch.float32)
            tokens = torch.randint(0, cfg.model.vocab_size, (2, 5))
            logits = model(tokens, torch.arange(5).expand(2, 5))
            assert torch.isfinite(logits).all(), (key, value)


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        preflight(list(overrides))
    message = str(err.value)
    assert "\n" not in message and "Exception" not in message
    return message


@pytest.mark.parametrize(
    "override",
    ["rl.steps=$(id)", "rl.steps=🚀", "model=模型", "hydra.run.dir=/tmp/a b/ü"],
)
def test_an_override_the_grammar_cannot_read_is_one_sentence_with_its_quoting(override):
    message = refusal(override)
    key, _, value = override.partition("=")
    assert f"the override {override!r} cannot be read" in message
    assert f"quote the value, {key}='{value}'" in message
    preflight_quoted = f"{key}='{value}'"  # the advice parses (then the value is checked)
    try:
        preflight([preflight_quoted])
    except ConfigError as err:
        assert "cannot be read" not in str(err)


def test_the_quoted_values_are_then_checked_as_values():
    assert refusal("model='模型'").startswith("model='模型' is not an option of model")
    assert refusal("rl.steps='🚀'") == "rl.steps='🚀' must be a whole number (rl.steps)."
    preflight(["hydra.run.dir='/tmp/a b/ü'"])


@pytest.mark.parametrize(
    "override,kind",
    [
        ("rl.steps=abc", "a whole number"),
        ("rl.steps=2.5", "a whole number"),
        ("rl.lr=fast", "a number"),
        ("zero_train_gen_mismatch=maybe", "true or false"),
        ("rl.betas=[a,b]", "a list of numbers"),
        ("model.moe.mlp_only_layers=[x]", "a list of whole numbers"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_key_and_the_type(override, kind):
    key = override.partition("=")[0]
    assert refusal(override) == f"{override} must be {kind} ({key})."


def test_null_for_a_key_that_needs_a_value():
    assert refusal("rl.steps=null") == "rl.steps=null: rl.steps cannot be null."
    preflight(["model.checkpoint=null", "trainer.fsdp=null"])


@pytest.mark.parametrize(
    "overrides,group",
    [
        (["layout=dedicated", "layout=colocated"], "layout"),  # +layout is normalized first
        (["model=tiny_dense", "model=tiny_moe"], "model"),
        (["model=tiny_moe", "model=tiny_moe"], "model"),
        (["precision=bf16", "model=tiny_moe", "precision=mxfp8"], "precision"),
    ],
)
def test_a_group_given_twice_is_refused(overrides, group):
    assert refusal(*overrides).startswith(f"the group {group} is given twice")


def test_the_cert_and_bench_keys_are_not_the_core_runs():
    from zkl.cert.schema import CertRunConfig
    from zkl.help import help_text
    from zkl.lab.schema import BenchRunConfig
    from zkl.run.schema import ZklConfig

    assert not {"cert", "bench"} & {f.name for f in dataclasses.fields(ZklConfig)}
    assert refusal("cert.steps=2").startswith("cert.steps is not a config key; did you mean")
    with pytest.raises(ConfigError, match=r"^bench is not a config key"):
        make_cfg("+bench.workload=rl")
    preflight(["cert.steps=2"], schema=CertRunConfig)
    preflight(["bench.workload=rl"], schema=BenchRunConfig)
    core, cert = help_text("zkl"), help_text("zkl.cert", CertRunConfig)
    bench = help_text("zkl.bench", BenchRunConfig)
    assert "cert." not in core and "bench." not in core
    assert "cert.steps=0" in cert and "bench." not in cert and "  seed=0" in cert
    assert "bench.workload='short'" in bench or "bench.workload=short" in bench
    assert "cert." not in bench and "0: one on a CPU run" in bench  # inherited comments


def _entry(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m module args` with a hook that says at exit whether torch was imported."""
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, "
        "file=sys.stderr))\n"
        f"sys.argv = [{module!r}, *sys.argv[1:]]\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _lines(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "module,args,key,made",
    [
        (
            "zkl",
            ["model=tiny_hybrid", "model.moe.num_expert_groups=0"],
            "model.moe.num_expert_groups=0",
            True,
        ),
        ("zkl", ["model.mamba.time_step_min=-1"], "model.mamba.time_step_min", True),
        ("zkl", ["rl.steps=abc"], "rl.steps=abc", False),
        ("zkl", ["+layout=dedicated", "+layout=colocated"], "the group layout", False),
        ("zkl", ["cert.steps=2"], "cert.steps is not a config key", False),
        ("zkl.cert", ["cert.steps=-1"], "cert.steps=-1", True),
        ("zkl.bench", ["rl.steps=🚀"], "quote the value", False),
    ],
)
def test_a_refusal_comes_before_torch_and_leaves_its_sentence(module, args, key, made, tmp_path):
    """Exit 2, one line, torch never imported (the refusal is immediate); a run directory
    Hydra made holds that line in error.txt, a command line refused earlier leaves none."""
    run_dir = tmp_path / "run ü"
    out = _entry(module, *args, f"hydra.run.dir='{run_dir}'", cwd=tmp_path)
    *lines, hook = _lines(out)
    assert out.returncode == 2 and len(lines) == 1 and key in lines[0], out.stderr[-2000:]
    if module != "zkl.cert":  # cert's own check (cert.steps) runs in the certification
        assert hook == "torch imported: False"
    assert run_dir.exists() == made
    if made:
        assert f"{module}: {read_error(run_dir)}" == lines[0]


@pytest.mark.slow
def test_every_refused_job_of_a_multirun_leaves_error_txt(tmp_path):
    out = _entry("zkl", "-m", "rl.steps=0,-1", f"hydra.sweep.dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    for job, steps in zip(jobs, (0, -1)):
        assert read_error(job) == f"rl.steps={steps} must be positive."


def test_a_run_directory_refused_for_a_full_disk_is_not_left_behind(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from zkl import cli

    full = SimpleNamespace(f_bavail=0, f_frsize=4096)
    monkeypatch.setattr(cli.os, "statvfs", lambda path: full)
    assert cli.run_dir_problem(str(tmp_path / "new")) == "is on a full disk"
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()  # one the user made stays
    assert cli.run_dir_problem(str(tmp_path / "old")) == "is on a full disk"
    assert (tmp_path / "old").is_dir()

"""Hostile command lines stop before any work with one sentence naming the key (exit 2).

Categories of hostile input: values a later stage would trip over with a traceback,
non-finite floats, settings a run could silently ignore, sizes that cannot fit. Many cases
run in-process through `compose` + `validate`; a few of each category run the real entry
points.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cert_cfg, make_cfg
from zkl import memory
from zkl.errors import ConfigError
from zkl.run.schema import ZklConfig
from zkl.run.validate import default_positions, validate
from zkl.run.values import INT_MAX, leaves

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "tests" / "helpers" / "entry_runner.py"
HUGE = 10**13  # bytes: memory is never the limit in the cases that are about something else


@pytest.fixture
def roomy(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: HUGE)


def refusal(overrides: list[str]) -> str:
    """The one-sentence ConfigError of composing and validating `overrides`."""
    with pytest.raises(ConfigError) as err:
        validate(make_cfg(*overrides))
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


TRACEBACKS = [  # category 1: each would fail later with a traceback
    (["task.name=sub"], "task.name"),
    (["rl.weight_decay=-0.1"], "rl.weight_decay"),
    (["rl.betas=[0.9]"], "rl.betas"),
    (["rl.betas=[0.9,0.999,0.5]"], "rl.betas"),
    (["rl.betas=[0.9,1.0]"], "rl.betas"),
    (["rl.num_minibatches=65"], "rl.num_minibatches"),
    (["model.head_dim=15"], "model.head_dim"),
    (["seed=18446744073709551616"], "seed"),
    (["seed=-1"], "seed"),
    (["sampling.temperature=1e-40"], "sampling.temperature"),
    (["model.init_std=-1"], "model.init_std"),
]
IGNORED = [  # category 3: each could run as if it had not been given
    (["scheduler.cuda_graphs=sometimes"], "scheduler.cuda_graphs"),
    (["scheduler.cuda_graphs=on"], "scheduler.cuda_graphs"),  # the CPU default device
    (["tracking.dump_tokens='²'"], "tracking.dump_tokens"),
    (["tracking.dump_tokens='99999999999999999999'"], "tracking.dump_tokens"),
    (["layout.timeout_s=0"], "layout.timeout_s"),
    (["layout.timeout_s=1e12"], "layout.timeout_s"),
    (["rl.warn_untrained_after=-1"], "rl.warn_untrained_after"),  # would never warn
]
SIZES = [  # category 4: each would hang or end in an allocator traceback
    (["rl.prompts_per_step=100000000"], "rl.prompts_per_step"),
    (["scheduler.max_batch_size=100000000"], "scheduler.max_batch_size"),
    (["model.vocab_size=2000000000"], "model.vocab_size"),
    (["sampling.max_new_tokens=1000000000"], "sampling.max_new_tokens"),
    (["model.max_position_embeddings=2000000000"], "model.max_position_embeddings"),
    (
        ["sampling.max_new_tokens=100000000", "model.max_position_embeddings=200000000"],
        "sampling.max_new_tokens",
    ),
    (["kv=persist", "scheduler.prefix_cache_blocks=2000000000"], "scheduler.prefix_cache_blocks"),
    (["num_threads=5000"], "num_threads"),
]


@pytest.mark.parametrize("overrides,key", TRACEBACKS + IGNORED, ids=lambda v: str(v))
def test_values_that_failed_late_are_one_sentence(overrides, key):
    assert key in refusal(overrides)


@pytest.mark.parametrize("overrides,key", SIZES, ids=lambda v: str(v))
def test_sizes_that_cannot_fit_are_refused(overrides, key):
    assert key in refusal(overrides)


def _float_keys() -> list[str]:
    cfg = ZklConfig()
    return [k for k, v in leaves(cfg) if isinstance(v, float) or k == "rl.betas"]


@pytest.mark.parametrize("key", _float_keys())
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_every_float_knob_rejects_nan_and_infinities(key, bad):
    value = f"[{bad},0.9]" if key == "rl.betas" else bad
    message = refusal([f"{key}={value}"])
    assert message.startswith(f"{key}=") and "finite" in message


def _int_keys() -> list[str]:
    ints = [k for k, v in leaves(ZklConfig()) if isinstance(v, int) and not isinstance(v, bool)]
    return ints + ["model.moe.mlp_only_layers"]


@pytest.mark.parametrize("key", _int_keys())
def test_every_integer_knob_has_an_upper_bound(key):
    big = 2**64 if key == "seed" else 2**40
    value = f"[{big}]" if key == "model.moe.mlp_only_layers" else str(big)
    message = refusal([f"{key}={value}"])
    assert message.startswith(f"{key}=")
    assert f"at most {2**63 - 1 if key == 'seed' else INT_MAX}" in message.replace("and", "at most")


@pytest.mark.parametrize(
    "override,suggested",
    [
        ("+rl.stepz=2", "rl.steps"),
        ("+model.hiden_size=32", "model.hidden_size"),
        ("+rl.temperature=0.5", "sampling.temperature"),
        ("+tracking.wandb.projet=x", "tracking.wandb.project"),
        ("+fixes.batch_invariant_gem=false", "fixes.batch_invariant_gemm"),
    ],
)
def test_unknown_keys_are_refused_with_the_nearest_key(override, suggested):
    with pytest.raises(ConfigError, match=rf"is not a config key; did you mean {suggested}\?$"):
        make_cfg(override)


def test_unknown_keys_without_a_near_one_list_what_exists():
    with pytest.raises(ConfigError, match="fixes.nope is not a config key; the keys under fixes"):
        make_cfg("+fixes.nope=false")
    with pytest.raises(ConfigError, match=r"^foo is not a config key; .*--cfg job"):
        make_cfg("+foo=1")
    with pytest.raises(ConfigError, match=r"\(other unknown keys: foo\)"):
        make_cfg("+rl.stepz=2", "+foo=1")


def test_real_models_validate_when_memory_fits(roomy):
    for model in ("qwen2_5_1_5b", "qwen3_30b_a3b"):
        validate(make_cfg(f"model={model}"))


def test_a_model_too_large_for_the_machine_names_the_estimate(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 24 * 10**9)
    message = refusal(["model=qwen3_30b_a3b"])
    cfg = make_cfg("model=qwen3_30b_a3b")
    estimate = memory.peak(memory.estimate(cfg, default_positions(cfg))) / 1e9
    assert f"needs about {estimate:.1f} GB" in message and "24.0 GB free" in message
    assert "model=" in message and "weights and optimizer state" in message


def test_a_cuda_run_is_checked_against_the_device(monkeypatch):
    monkeypatch.setattr(memory, "on_cuda", lambda cfg: True)
    monkeypatch.setattr(memory.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory.torch.cuda, "mem_get_info", lambda *device: (2 * 10**9, 80 * 10**9))
    monkeypatch.setattr(memory, "available_bytes", lambda: HUGE)
    message = refusal(["model=qwen2_5_1_5b"])
    assert "the GPU has 2.0 GB free" in message
    monkeypatch.setattr(memory.torch.cuda, "mem_get_info", lambda *device: (HUGE, HUGE))
    validate(make_cfg("model=qwen2_5_1_5b"))


def test_a_real_model_without_checkpoint_warns_of_random_weights(capsys):
    from zkl.models.hf_weights_check import warn_random_weights

    warn_random_weights(make_cfg("model=qwen2_5_1_5b").model)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "random" in lines[0] and "model.checkpoint" in lines[0]
    warn_random_weights(make_cfg().model)  # the tiny default is meant to be random
    assert capsys.readouterr().err == ""


def run_entry(module: str, args: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    """The entry point as a subprocess (model builds announced by the runner)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, str(RUNNER), module, *args, f"hydra.run.dir={run_dir}"]
    return subprocess.run(cmd, cwd=run_dir.parent, env=env, capture_output=True, text=True)


def assert_refused_before_work(out: subprocess.CompletedProcess, run_dir: Path, key: str):
    """Exit 2, one line naming `key`, no traceback, no model; no run directory, or one with
    only Hydra's files and error.txt holding that line (what the report shows)."""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and key in lines[0], lines
    assert "Traceback" not in out.stderr and "a model was built" not in out.stderr
    if not run_dir.exists():
        return
    job = {"zkl": "__main__", "zkl.cert": "cert", "zkl.bench": "bench"}
    hydra_files = {".hydra", f"{job[out.args[2]]}.log", "error.txt"}
    assert set(os.listdir(run_dir)) <= hydra_files
    prog = out.args[2]
    assert f"{prog}: " + (run_dir / "error.txt").read_text().strip() == lines[0]


CLI = [  # (entry point, overrides, key): a few of each category through the real entry points
    ("zkl", ["task.name=sub"], "task.name"),
    ("zkl.bench", ["rl.betas=[0.9]"], "rl.betas"),
    ("zkl", ["rl.clip_eps=nan"], "rl.clip_eps"),
    ("zkl.cert", ["sampling.temperature=inf"], "sampling.temperature"),
    ("zkl", ["+rl.stepz=2"], "rl.steps"),
    ("zkl.cert", ["tracking.dump_tokens='²'"], "tracking.dump_tokens"),
    ("zkl", ["rl.prompts_per_step=100000000"], "rl.prompts_per_step"),
    ("zkl", ["scheduler.max_batch_size=100000000"], "scheduler.max_batch_size"),
]


@pytest.mark.parametrize("module,overrides,key", CLI, ids=[c[2] for c in CLI])
@pytest.mark.slow
def test_entry_points_refuse_before_work(module, overrides, key, tmp_path):
    run_dir = tmp_path / "run"
    out = run_entry(module, overrides, run_dir)
    assert_refused_before_work(out, run_dir, key)


@pytest.mark.slow
def test_a_30b_model_on_a_small_machine_is_refused_with_the_estimate(tmp_path):
    cfg = make_cfg("model=qwen3_30b_a3b")
    needed = memory.peak(memory.estimate(cfg, default_positions(cfg)))
    if memory.available_bytes() >= needed:
        pytest.skip(f"this machine has the {needed / 1e9:.0f} GB the 30B run needs")
    out = run_entry("zkl", ["model=qwen3_30b_a3b"], tmp_path / "run")
    assert_refused_before_work(out, tmp_path / "run", "model=")
    assert f"about {needed / 1e9:.1f} GB" in out.stderr


@pytest.mark.slow
def test_a_diverged_update_stops_the_run_after_logging_its_step(tmp_path):
    """NaN/inf hides in the metrics (NaN != NaN, max() skips it): the run stops loudly."""
    from zkl.errors import NonFinite
    from zkl.rl.loop import run

    small = ["rl.prompts_per_step=2", "rl.samples_per_prompt=2"]
    with pytest.raises(NonFinite, match=r"^step 0: optim/update_norm not finite .* rl.lr"):
        run(make_cfg("rl.steps=3", "rl.lr=1e30", *small), tmp_path / "run")
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


def test_cert_fails_a_diverged_bed_and_certifies_the_rest(tmp_path):
    from zkl.cert.certificate import run_cert

    cfg = cert_cfg("rl.lr=1e30", "cert.steps=2", "cert.models=[tiny_dense,tiny_moe]")
    rows = run_cert(cfg, tmp_path)
    assert len(rows) == 2
    assert all(not r["passed"] and "not finite" in r["result"] for r in rows)


def test_the_mamba_chunk_scan_is_in_the_estimate(monkeypatch):
    """A Nemotron-H scan at 128-position chunks builds [Q, Q, H, N] products a few chunks at a
    time and keeps [Q, H] rows of every position for the backward: a run that cannot hold
    them is refused with the part named, not killed by the OOM killer."""
    cut = ["model=nemotron3_nano_30b_a3b", "model.num_hidden_layers=3"]
    cut += ["model.hybrid_override_pattern=M*E", "model.hidden_size=256"]
    cut += ["model.moe.num_experts=8", "model.vocab_size=4096", "task.name=residue"]
    cfg = make_cfg(*cut)
    parts = memory.estimate(cfg, 80)
    samples = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
    assert parts["Mamba chunk scan"] == memory.mamba_scan_bytes(cfg.model, samples, 80) > 0
    assert parts["update activations"] > memory.mamba_saved_bytes(cfg, samples, 80) > 0
    assert memory.estimate(make_cfg("model=tiny_dense"), 80)["Mamba chunk scan"] == 0.0
    monkeypatch.setattr(memory, "available_bytes", lambda: parts["update activations"] / 2)
    message = refusal(cut)
    assert "the largest part is the update activations" in message
    assert "trainer.activation_checkpointing=true" in message
    checkpointed = cut + ["trainer.activation_checkpointing=true"]
    remade = memory.estimate(make_cfg(*checkpointed), 80)["update activations"]
    monkeypatch.setattr(memory, "available_bytes", lambda: remade / 2)
    message = refusal(checkpointed)
    assert "the largest part is the update activations" in message
    assert "activation_checkpointing" not in message and "rl.num_minibatches" in message

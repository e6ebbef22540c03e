"""Every config composes and runs one step; bad input stops with one sentence naming the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMALL, make_cfg
from zkl.engines import engine_problem
from zkl.errors import ConfigError
from zkl.models.registry import family
from zkl.rl.loop import run
from zkl.run.schema import CONF_DIR
from zkl.run.validate import check_run, validate

REPO = Path(__file__).resolve().parents[2]
TINY = ["tiny_dense", "tiny_moe", "tiny_hybrid", "tiny_gpt_oss"]


def options(group: str) -> list[str]:
    return sorted(p[:-5] for p in os.listdir(os.path.join(CONF_DIR, group)) if p.endswith(".yaml"))


def test_plain_and_appended_groups_compose():
    cfg = make_cfg()
    assert (cfg.precision.name, cfg.layout.name, cfg.model.name) == (
        "bf16",
        "colocated",
        "tiny_dense",
    )
    cfg = make_cfg("+precision=fp32", "+layout=dedicated", "kv=persist", "model=tiny_moe")
    assert (cfg.precision.compute_dtype, cfg.layout.name, cfg.kv.mode) == (
        "float32",
        "dedicated",
        "persist",
    )
    assert cfg.model.moe.num_experts == 8


@pytest.mark.parametrize("model", options("model"))
def test_every_model_config_validates(model, monkeypatch):
    from zkl import memory

    monkeypatch.setattr(memory, "available_bytes", lambda: 10**13)  # whatever this machine has
    cfg = make_cfg(f"model={model}")
    validate(cfg)
    assert cfg.model.name == model


def test_real_shapes_match_public_configs():
    q = make_cfg("model=qwen3_30b_a3b").model
    assert (q.hidden_size, q.num_hidden_layers, q.moe.num_experts, q.moe.num_experts_per_tok) == (
        2048,
        48,
        128,
        8,
    )
    assert (q.moe.intermediate_size, q.head_dim, q.num_key_value_heads, q.vocab_size) == (
        768,
        128,
        4,
        151936,
    )
    d = make_cfg("model=qwen2_5_1_5b").model
    assert (d.hidden_size, d.num_hidden_layers, d.intermediate_size, d.num_attention_heads) == (
        1536,
        28,
        8960,
        12,
    )
    assert (d.num_key_value_heads, d.qkv_bias, d.tie_word_embeddings) == (2, True, True)
    h = make_cfg("model=nemotron3_nano_30b_a3b").model
    kinds = [h.layer_kind(i) for i in range(h.num_hidden_layers)]
    assert [kinds.count(k) for k in ("mamba", "moe", "attention")] == [23, 23, 6]
    assert (h.hidden_size, h.mamba.num_heads, h.mamba.head_dim, h.mamba.state_size) == (
        2688,
        64,
        64,
        128,
    )
    assert (h.moe.num_experts, h.moe.num_experts_per_tok, h.moe.intermediate_size) == (128, 6, 1856)
    g = make_cfg("model=gpt_oss_20b").model
    assert (g.hidden_size, g.num_hidden_layers, g.num_attention_heads, g.head_dim) == (
        2880,
        24,
        64,
        64,
    )
    assert (g.num_key_value_heads, g.moe.num_experts, g.moe.num_experts_per_tok, g.vocab_size) == (
        8,
        32,
        4,
        201088,
    )
    assert (g.moe.intermediate_size, g.sliding_window, g.layer_types[:2]) == (
        2880,
        128,
        ["sliding_attention", "full_attention"],
    )


# one GRPO step for every option of every group (real-shape models validate above: too big to run)
SMOKE = (
    [[f"model={m}"] for m in TINY]
    + [[f"+precision={p}"] for p in options("precision")]
    + [[f"+layout={layout}"] for layout in options("layout")]
    + [[f"kv={k}"] for k in options("kv")]
    + [[f"engine={e}"] for e in options("engine")]
)


@pytest.mark.parametrize("overrides", SMOKE, ids=lambda o: o[0])
def test_every_config_runs_one_step(overrides, tmp_path):
    cfg = make_cfg(*overrides, *SMALL, "rl.steps=1")
    refusal = engine_problem(
        cfg.engine.name, cfg.layout.name, False, family(cfg.model), cfg.precision.linear_quant
    )
    if refusal:  # a megatron engine on a CPU run: its one sentence is the expected outcome
        with pytest.raises(ConfigError) as err:
            check_run(cfg)
        assert str(err.value) == refusal
        return
    check_run(cfg)
    rows = run(cfg, tmp_path)
    assert len(rows) == 1 and rows[0]["gen/response_tokens"] > 0


BAD = [
    (["model=tiny_moe", "model.moe.num_experts_per_tok=9"], "model.moe.num_experts_per_tok"),
    (["model.hidden_size=0"], "model.hidden_size"),
    (["model.num_attention_heads=3"], "model.num_attention_heads"),
    (["model.num_key_value_heads=3"], "model.num_key_value_heads"),
    (["model.vocab_size=16"], "model.vocab_size"),
    (["rl.lr=-1"], "rl.lr"),
    (["sampling.top_p=1.5"], "sampling.top_p"),
    (["scheduler.max_batch_size=0"], "scheduler.max_batch_size"),
    (["+precision=bf16", "precision.native=true"], "precision.native"),
    (["layout.name=remote"], "layout.name"),
    (["tracking.dump_tokens=some"], "tracking.dump_tokens"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[b[1] for b in BAD])
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        check_run(make_cfg(*overrides))
    message = str(err.value)
    assert key in message and ". " not in message and "\n" not in message  # one sentence


def _zkl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "zkl", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.mark.slow
def test_cli_bad_value_is_one_sentence_before_work(tmp_path):
    out = _zkl(
        "model=tiny_moe",
        "model.moe.num_experts_per_tok=9",
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [
        "zkl: model.moe.num_experts_per_tok=9 must be between 1 and model.moe.num_experts=8."
    ]
    assert not (tmp_path / "metrics.jsonl").exists()  # stopped before any work


def test_cli_misspelt_key_is_one_sentence(tmp_path):
    out = _zkl("model.hiden_size=32", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == ["zkl: model.hiden_size is not a config key; did you mean model.hidden_size?"]

"""Megatron engines on the CPU: the pure mapping and the fail-fast sentences (no megatron-core
needed), and, where megatron-core is installed (Python >= 3.12), the model built from it."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
import torch

from tests.conftest import make_cfg
from tests.megatron import mixed_length_requests
from zkl import invariance
from zkl.engines import engine_named, engine_problem, megatron_engines
from zkl.errors import ConfigError
from zkl.megatron.mapping import (
    from_megatron,
    gpt_model_kwargs,
    group_qkv,
    to_megatron,
    transformer_config_kwargs,
)
from zkl.models.build import build_model
from zkl.models.config import ModelConfig, replaced
from zkl.models.registry import FAMILIES
from zkl.models.transformer import Transformer, init_weights
from zkl.run.validate import validate

ENGINES = [e.name for e in megatron_engines()]
HAVE_MEGATRON = sys.version_info >= (3, 12) and importlib.util.find_spec("megatron") is not None


def model_cfg(name: str, **edits) -> ModelConfig:
    """`model=name` with top-level edits, and `moe` edits as a dict of its keys."""
    cfg = make_cfg(f"model={name}").model
    moe = edits.pop("moe", {})
    return replaced(cfg, {**edits, **{f"moe.{k}": v for k, v in moe.items()}})


def test_transformer_config_dense_and_moe():
    dense = transformer_config_kwargs(model_cfg("tiny_dense"), "bfloat16")
    assert dense["num_query_groups"] == 2 and dense["kv_channels"] == 16
    assert dense["ffn_hidden_size"] == 128 and dense["qk_layernorm"] is True
    assert dense["normalization"] == "RMSNorm" and dense["gated_linear_unit"] is True
    assert dense["hidden_dropout"] == 0.0 and dense["bf16"] is True
    assert "num_moe_experts" not in dense
    moe_cfg = model_cfg("tiny_moe")
    moe = transformer_config_kwargs(moe_cfg, "float32")
    assert moe["num_moe_experts"] == moe_cfg.moe.num_experts and moe["bf16"] is False
    assert moe["moe_router_topk"] == moe_cfg.moe.num_experts_per_tok
    assert moe["moe_router_pre_softmax"] is (not moe_cfg.moe.norm_topk_prob)
    assert moe["moe_layer_freq"] == [1] * moe_cfg.num_hidden_layers
    mixed = transformer_config_kwargs(
        model_cfg("tiny_moe", moe={"mlp_only_layers": [0]}), "bfloat16"
    )
    assert mixed["moe_layer_freq"][0] == 0
    assert gpt_model_kwargs(moe_cfg)["position_embedding_type"] == "none"
    with pytest.raises(ValueError, match="nemotron_h"):
        transformer_config_kwargs(model_cfg("tiny_hybrid"), "bfloat16")


@pytest.mark.parametrize(
    "name,edits",
    [
        ("tiny_dense", {}),
        ("tiny_moe", {}),
        ("tiny_dense", {"qkv_bias": True, "qk_norm": False, "tie_word_embeddings": False}),
    ],
)
@pytest.mark.parametrize("engine", ENGINES)
def test_name_mapping_round_trip(name, edits, engine):
    cfg = model_cfg(name, **edits)
    native = Transformer(cfg)
    init_weights(native, 3)
    state = native.state_dict()
    theirs = to_megatron(state, cfg, engine)
    back = from_megatron(theirs, cfg, engine)
    assert set(back) == set(state)
    for k in state:
        assert torch.equal(back[k], state[k]), k
    # every native tensor lands somewhere: the megatron dict holds exactly as many elements
    unique = {t.data_ptr(): t for t in state.values()}  # a tied lm_head is the embedding
    assert sum(t.numel() for t in theirs.values()) == sum(t.numel() for t in unique.values())
    fused_norm = "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in theirs
    assert fused_norm is engine_named(engine).fused_norm


def test_fused_qkv_is_grouped_per_kv_head():
    cfg = model_cfg("tiny_dense")  # 4 query heads, 2 KV heads, head_dim 16
    d = cfg.head_dim
    q = torch.arange(4 * d).float().unsqueeze(1)
    k = 1000 + torch.arange(2 * d).float().unsqueeze(1)
    v = 2000 + torch.arange(2 * d).float().unsqueeze(1)
    qkv = group_qkv(cfg, torch.cat([q, k, v]))[:, 0]  # zkl's qkv_proj: all q, all k, all v
    # group 0: query heads 0, 1, then key head 0, value head 0; then group 1
    expected = torch.cat([q[: 2 * d], k[:d], v[:d], q[2 * d :], k[d:], v[d:]])[:, 0]
    assert torch.equal(qkv, expected)


def test_engine_problem_sentences():
    yes = lambda _: True  # noqa: E731
    no = lambda _: False  # noqa: E731
    common = {"on_cuda": True, "family": FAMILIES["qwen3"], "linear_quant": "none"}
    old = engine_problem("megatron_local", "colocated", python=(3, 11), installed=yes, **common)
    assert "Python >= 3.12" in old and "3.11" in old
    missing = engine_problem("megatron_local", "colocated", python=(3, 12), installed=no, **common)
    assert "megatron-core" in missing and "not installed" in missing

    def no_te(p):
        return p != "transformer_engine"

    for engine in ("transformer_engine", "inference_optimized"):
        msg = engine_problem(engine, "dedicated", python=(3, 12), installed=no_te, **common)
        assert "Transformer Engine" in msg and "engine=megatron_local" in msg
    colo = engine_problem(
        "inference_optimized", "colocated", python=(3, 12), installed=yes, **common
    )
    assert "dedicated" in colo
    assert (
        engine_problem("inference_optimized", "dedicated", python=(3, 12), installed=yes, **common)
        is None
    )
    assert (
        engine_problem("megatron_local", "colocated", python=(3, 12), installed=yes, **common)
        is None
    )
    cpu = engine_problem(
        "megatron_local",
        "colocated",
        python=(3, 12),
        installed=yes,
        on_cuda=False,
        family=FAMILIES["qwen3"],
        linear_quant="none",
    )
    assert "device=cuda" in cpu
    hybrid = {**common, "family": FAMILIES["nemotron_h"]}
    unmapped = engine_problem(
        "megatron_local", "colocated", python=(3, 12), installed=yes, **hybrid
    )
    assert unmapped == "engine=megatron_local has no nemotron_h mapping yet; use engine=native."
    mx = {**common, "linear_quant": "mxfp8"}
    te_mx = engine_problem("transformer_engine", "colocated", python=(3, 12), installed=yes, **mx)
    assert "MXFP8 recipe needs compute capability 10.0" in te_mx and "+precision=bf16" in te_mx
    local_mx = engine_problem("megatron_local", "colocated", python=(3, 12), installed=yes, **mx)
    assert "bf16/fp32 recipes only;" in local_mx and "Transformer Engine" not in local_mx
    for msg in (old, missing, colo, cpu, unmapped, te_mx, local_mx):
        assert "\n" not in msg and msg.count(". ") == 0 and msg.endswith(".")
    assert engine_problem("native", "colocated", **common) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_config_refuses_engine_it_cannot_run(engine):
    """On this machine: the one sentence of `engine_problem`, raised by validate."""
    cfg = make_cfg(f"engine={engine}")
    expected = engine_problem(engine, cfg.layout.name, False, FAMILIES[cfg.model.family], "none")
    assert expected is not None  # device=cpu: never runnable here
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value) == expected


# -- with megatron-core installed (Python >= 3.12): the model itself on the CPU -------------

needs_megatron = pytest.mark.skipif(not HAVE_MEGATRON, reason="needs megatron-core")


@needs_megatron
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", ["tiny_dense", "tiny_moe"])
def test_megatron_zero_mode_equals_native_on_cpu(name, dtype):
    """Same weights, zkl's kernels in every slot (the MLP's SwiGLU included, which fp32
    shows: megatron's own `F.silu(gate) * up` differs by an ulp): native's bits."""
    from zkl.megatron.model import build_megatron_model

    cfg = model_cfg(name)
    with invariance.enabled(invariance.FIXES):
        mega = build_megatron_model(cfg, "megatron_local", dtype, 0, "cpu")
        native = build_model(cfg, dtype, seed=0)
        tokens = torch.randint(
            0, cfg.vocab_size, (3, 13), generator=torch.Generator().manual_seed(0)
        )
        positions = torch.arange(13).expand(3, 13)
        assert torch.equal(mega(tokens, positions), native(tokens, positions))
        index = torch.tensor([12, 4, 0])
        assert torch.equal(
            mega(tokens, positions, logit_index=index), native(tokens, positions, logit_index=index)
        )


@needs_megatron
def test_megatron_engine_zero_on_cpu():
    """zkl's scheduler over the megatron model: generated logprobs == scored, bit for bit."""
    from zkl.generation.scheduler import Scheduler
    from zkl.megatron.model import build_megatron_model
    from zkl.trainer.scoring import score

    cfg = model_cfg("tiny_moe")
    requests = mixed_length_requests(60, max_new_tokens=5)
    with invariance.enabled(invariance.FIXES):
        model = build_megatron_model(cfg, "megatron_local", torch.bfloat16, 0, "cpu")
        scheduler = Scheduler(model, max_batch_size=4, eos_id=1, prefill_chunk=5)
        done = scheduler.generate(requests)
        lp = score(model, [c.prompt for c in done], [c.tokens for c in done])
        for c, s in zip(done, lp):
            assert torch.equal(c.logprobs, s)


@needs_megatron
@pytest.mark.parametrize(
    "positions, real",
    [
        (torch.arange(9).expand(3, 9), [9, 9, 9]),  # scoring: 0..T-1, rows right-padded
        (  # a prefill chunk: starts 0, 5, 9; row 1 padded within the cache, row 2's pads
            # clamped at the cache's last slot (12)
            torch.tensor([[0, 1, 2, 3, 4, 5], [5, 6, 7, 8, 9, 10], [9, 10, 11, 12, 12, 12]]),
            [6, 4, 3],
        ),
        (torch.tensor([[4], [0], [11]]), [1, 1, 1]),  # a decode step
    ],
    ids=["score", "prefill", "decode"],
)
def test_bottom_right_seqlens_give_zkls_causal_rule(positions, real):
    """Transformer Engine's padded bottom-right causal mask, as the TE engines' default-mode
    attention gives it the rows, shows each query that is read exactly the keys 0..p."""
    from zkl.megatron.attention import bottom_right_seqlens

    cu_q, cu_kv = bottom_right_seqlens(positions)
    assert cu_q.dtype == cu_kv.dtype == torch.int32
    q_len, kv_len = cu_q.diff(), cu_kv.diff()
    keys = torch.arange(int(positions.max()) + 1)
    for b, n in enumerate(real):
        for i in range(n):  # TE: query i sees keys j < kv_len with j <= kv_len - q_len + i
            assert i < q_len[b]
            te = (keys < kv_len[b]) & (keys <= kv_len[b] - q_len[b] + i)
            assert torch.equal(te, keys <= positions[b, i])


@needs_megatron
@pytest.mark.parametrize("name", ["tiny_dense", "tiny_moe"])
def test_megatron_model_exports_natives_hf_weights(name):
    """Checkpoint export (and the bench's transformers row) reads megatron's weights back
    under native names: the same HF tensors as the native model built from the same seed."""
    from zkl.megatron.model import build_megatron_model
    from zkl.models.hf_export import hf_state_dict

    cfg = model_cfg(name)
    mega = hf_state_dict(build_megatron_model(cfg, "megatron_local", torch.float32, 0, "cpu"))
    native = hf_state_dict(build_model(cfg, torch.float32, seed=0))
    assert mega.keys() == native.keys()
    assert all(torch.equal(mega[k], native[k]) for k in native)


@needs_megatron
def test_default_router_hands_its_gemm_one_dtype(monkeypatch):
    """Transformer Engine's gating GEMM (megatron's wherever TE is installed) takes one input
    dtype; zkl's fp32 router weight beside bf16 activations is what cuBLASLt refused on the
    H100. Default mode's router gives it the weight in the activations' dtype."""
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.router import TopKRouter

    from zkl.megatron.model import build_megatron_model

    def one_dtype_gemm(a, b, out_dtype, layout, bias=None, **_):
        if a.dtype != b.dtype:
            raise RuntimeError("Unable to find suitable cuBLAS GEMM algorithm")
        return [(b @ a.t()).to(out_dtype)]

    monkeypatch.setattr(moe_utils, "te_general_gemm", one_dtype_gemm)
    cfg = model_cfg("tiny_moe")
    model = build_megatron_model(cfg, "megatron_local", torch.bfloat16, 0, "cpu")
    router = next(m for m in model.modules() if isinstance(m, TopKRouter))
    assert router.weight.dtype == torch.float32  # zkl's recipe
    x = torch.randn(7, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    x = x.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="cuBLAS"):  # megatron's own gating, zkl's weight
        moe_utils.router_gating_linear(x, router.weight, None, x.dtype)
    logits = router.gating(x)
    assert logits.dtype == torch.bfloat16
    assert torch.equal(logits, x @ router.weight.to(torch.bfloat16).t())


def test_gpu_script_is_valid_bash_and_bounded():
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_megatron.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    prelude, stages = text.split("for stage in $STAGES", 1)
    limit = re.compile(r"(?:^|\|\| )\s*step \S+ (\d+) ", re.M)
    before = sum(map(int, limit.findall(prelude)))
    blocks = re.findall(r"^\s+(\w+)\)\n(.*?)^\s+;;", stages, re.M | re.S)
    assert {name for name, _ in blocks} == {"cert", "extra", "big", "bench"}
    for name, body in blocks:  # each stage fits one device call with the checks before it
        total = before + sum(map(int, limit.findall(body)))
        assert total <= 540, f"stage {name}: {total} s"

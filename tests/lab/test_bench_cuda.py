"""The CUDA benchmark's arithmetic on the CPU (roofline bytes, shapes, table), and one short
run of the whole table on a tiny model on the GPU."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_cfg
from zkl.models.build import build_model
from zkl.models.config import ModelConfig

pytest.importorskip("triton")
from zkl.lab import bench_cuda, bench_gemm  # noqa: E402
from zkl.lab.roofline import decode_bytes, moe_layers  # noqa: E402
from zkl.lab.timing import format_table  # noqa: E402
from zkl.lab.workload import MODES, NEW_TOKENS, PROMPT_LEN, bench_requests  # noqa: E402


def test_decode_bytes_counts_weights_once_and_the_live_kv():
    cfg = ModelConfig(family="qwen2", tie_word_embeddings=True, qk_norm=False, qkv_bias=True)
    model = build_model(cfg, torch.bfloat16, seed=1)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    assert decode_bytes(model, 4, 99.0) == weights + 4 * 100 * kv
    untied_cfg = ModelConfig(family="qwen3", tie_word_embeddings=False)
    untied = build_model(untied_cfg, torch.bfloat16, seed=1)
    table = untied.embed_tokens.weight.numel() * 2
    total = sum(p.numel() * p.element_size() for p in untied.parameters())
    kv = 2 * untied.cfg.num_hidden_layers * untied.cfg.num_key_value_heads * untied.cfg.head_dim
    assert decode_bytes(untied, 1, 0.0) == total - table + 2 * kv


def test_moe_roofline_counts_the_experts_a_step_reads():
    """An MoE step reads only the experts it routes to: the roofline's bytes drop by each
    unread expert's weights, and the count comes from the router of a real decode step."""
    cfg = make_cfg("model=tiny_moe", "model.max_position_embeddings=1024").model
    model = build_model(cfg, torch.bfloat16, seed=1)
    layers = moe_layers(model)
    expert = sum(p.numel() * p.element_size() for p in layers[0].experts[0].parameters())
    every = [cfg.moe.num_experts] * len(layers)
    assert decode_bytes(model, 2, 10.0, every) == decode_bytes(model, 2, 10.0)
    one = [1] * len(layers)
    saved = len(layers) * (cfg.moe.num_experts - 1) * expert
    assert decode_bytes(model, 2, 10.0, one) == decode_bytes(model, 2, 10.0) - saved
    read = bench_cuda.experts_read(model, batch=3)
    assert len(read) == len(layers)
    top_k = cfg.moe.num_experts_per_tok
    assert all(top_k <= n <= min(cfg.moe.num_experts, 3 * top_k) for n in read), read


def test_gemm_shapes_and_table():
    cfg = make_cfg("model=qwen2_5_1_5b").model
    shapes = dict((name, (k, n)) for name, k, n in bench_gemm.gemm_shapes(cfg))
    assert shapes["down"] == (8960, 1536) and shapes["gate_up"] == (1536, 17920)
    assert shapes["qkv"] == (1536, 1536 + 2 * 256) and shapes["lm_head"] == (1536, 151936)
    text = format_table({"a": 1.23456, "b": "x"})
    assert text.splitlines()[0].split() == ["a", "1.235"] and text.endswith("x")


def test_requests_are_fixed_length_and_seeded():
    a, b = bench_requests(3, 100), bench_requests(3, 100)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert all(len(r.prompt) == PROMPT_LEN for r in a)
    assert all(r.params.max_new_tokens == NEW_TOKENS for r in a)


@pytest.mark.gpu
def test_cuda_table_on_a_tiny_model():
    cfg = make_cfg("model=tiny_dense", "model.max_position_embeddings=1024").model
    model = build_model(cfg, torch.bfloat16, seed=1, device="cuda")
    out = bench_cuda.run_cuda_bench(model, batches=(1, 4))
    for batch in (1, 4):
        assert out[f"gen/b{batch}/zero_over_default"] > 0
        assert out[f"roofline/b{batch}/zero_fraction"] > 0
    assert out["train/zero/step_s"] > 0 and out["gemm/4096^3/zkl_tflops"] > 0
    assert "hf/skipped" in out or out["hf/b4/gen_tokens_per_s"] > 0
    assert "Self CUDA" in bench_cuda.profile_decode_step(model, 4, MODES["zero"])


@pytest.mark.gpu
def test_cuda_table_on_a_tiny_moe_model():
    """An MoE model's table: generation with graphs in both modes, peak memory, the train
    step and the roofline over the experts read; no dense GEMM tiles."""
    cfg = make_cfg("model=tiny_moe", "model.max_position_embeddings=1024").model
    model = build_model(cfg, torch.bfloat16, seed=1, device="cuda")
    out = bench_cuda.run_cuda_bench(model, batches=(1, 4))
    for batch in (1, 4):
        assert out[f"gen/b{batch}/zero/graphs"] == 1 and out[f"gen/b{batch}/default/graphs"] == 1
        assert out[f"gen/b{batch}/zero/peak_gib"] > 0
        assert out[f"roofline/b{batch}/experts_read_per_layer"] >= cfg.moe.num_experts_per_tok
    assert out["train/zero/step_s"] > 0 and not any(k.startswith("gemm/") for k in out)


@pytest.mark.gpu
def test_tile_candidates_report_speed_and_bits():
    out = bench_gemm.gemm_at("t", 64, 1024, 1024, configs=((64, 64, 64, 4, 4),))
    assert out["gemm/t/zkl_tflops"] > 0 and out["gemm/t/zkl_over_cublas"] > 0
    assert out["gemm/t/zkl_bitwise_fixed"] == 1.0  # the tile M picked has the fixed bits
    assert out["tiles/t/64x64x64x4x4/over_cublas"] > 0
    assert out["tiles/t/64x64x64x4x4/bitwise_equal"] == 1.0  # no split-K: the same bits


def test_transformers_peer_of_the_bench_holds_the_same_weights():
    """The bench's transformers row runs zkl's weights: fused q/k/v and gate/up are split back
    into HF's projections, and HF's logits match zkl's (bf16, tolerance 2e-2)."""
    pytest.importorskip("transformers")
    from zkl.lab.bench_hf import hf_model

    cfg = ModelConfig(family="qwen2", tie_word_embeddings=True, qk_norm=False, qkv_bias=True)
    model = build_model(cfg, torch.bfloat16, seed=1)
    hf = hf_model(model)
    assert not isinstance(hf, str), hf
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens, torch.arange(12).expand(2, 12)).float()
        theirs = hf(tokens).logits.float()
    torch.testing.assert_close(theirs, ours, rtol=2e-2, atol=2e-2)

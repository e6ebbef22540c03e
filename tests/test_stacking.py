"""Stacked projections: q/k/v and gate/up moved into one storage without changing a value,
kept stacked by in-place writes, used only where exact (never on the CPU reference, never
with gradients or a quantizing recipe)."""

from __future__ import annotations

import pytest
import torch
from conftest import small_model

from zkl import ops
from zkl.models import ModelConfig, build_model
from zkl.models.stacking import projection_groups, stack_projections, stacked_linear


def _stacked_storage(linears) -> bool:
    base = linears[0].weight.untyped_storage().data_ptr()
    return all(lin.weight.untyped_storage().data_ptr() == base for lin in linears)


def test_stacking_moves_parameters_into_one_storage_and_keeps_every_value():
    model = small_model(moe=True)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    params = dict(model.named_parameters())
    groups = projection_groups(model)
    # every attention's q/k/v and every MLP's (experts' too) gate/up
    assert len(groups) == model.cfg.num_hidden_layers * (1 + model.cfg.num_experts)
    assert stack_projections(model) > 0
    assert stack_projections(model) == 0  # already stacked: nothing moves
    assert all(_stacked_storage(g) for g in groups)
    for name, p in model.named_parameters():
        assert p is params[name] and torch.equal(p, before[name])


def test_in_place_updates_keep_the_stack_and_show_through_it(monkeypatch):
    model = small_model()
    stack_projections(model)
    attn = model.layers[0].self_attn
    linears = (attn.q_proj, attn.k_proj, attn.v_proj)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(2, 3, model.cfg.hidden_size, dtype=torch.bfloat16)
    model(
        torch.tensor([[1, 2, 3]]), torch.arange(3).unsqueeze(0)
    ).float().square().mean().backward()
    optimizer.step()  # writes in place: still one storage
    assert _stacked_storage(linears) and attn.k_proj.weight.grad is not None
    monkeypatch.setattr(ops, "linear_columns_agree", lambda *args: True)
    with torch.no_grad():
        q, k, v = stacked_linear(x, linears)
        for got, lin in zip((q, k, v), linears):  # the stack sees the updated weights
            torch.testing.assert_close(got, lin(x), rtol=0.02, atol=0.02)  # other GEMM shape


def test_stacked_linear_declines_where_it_is_not_exact_or_not_possible(monkeypatch):
    model = small_model()
    stack_projections(model)
    mlp = model.layers[0].mlp
    linears = (mlp.gate_proj, mlp.up_proj)
    x = torch.randn(2, model.cfg.hidden_size, dtype=torch.bfloat16)
    with torch.no_grad():
        assert stacked_linear(x, linears) is None  # the CPU reference runs each alone
    monkeypatch.setattr(ops, "linear_columns_agree", lambda *args: True)
    assert stacked_linear(x, linears) is None  # gradients on: each parameter gets its grad
    with torch.no_grad():
        assert stacked_linear(x, linears) is not None
        mlp.up_proj.weight.data = mlp.up_proj.weight.data.clone()  # moved out of the stack
        assert stacked_linear(x, linears) is None
        stack_projections(model)
        assert stacked_linear(x, linears) is not None
        mlp.up_proj.quantize = lambda t: t  # a quantizing recipe: per-module weight caches
        assert stacked_linear(x, linears) is None


def test_a_group_with_a_bias_on_some_parts_only_is_refused():
    cfg = ModelConfig(family="qwen2", qkv_bias=True)
    model = build_model(cfg, torch.float32, seed=0)
    model.layers[0].self_attn.k_proj.bias = None
    with pytest.raises(ValueError, match="bias on every part or on none"):
        stack_projections(model)


def test_positions_past_the_rotary_tables_are_refused_before_any_kernel():
    """The fused RoPE reads its tables without a bounds check, so the engine and the train
    path refuse what would need a position past them, naming the key."""
    from zkl.generation.engine import GenerationEngine, Request
    from zkl.generation.sampling import SamplingParams

    model = small_model()
    limit = model.cfg.max_position_embeddings
    engine = GenerationEngine(model, max_batch_size=2, eos_id=None)
    request = Request(0, [1] * (limit - 3), SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="model.max_position_embeddings"):
        engine.generate([request])
    tokens = torch.ones(1, limit + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="model.max_position_embeddings"):
        model(tokens, torch.arange(limit + 1).unsqueeze(0))

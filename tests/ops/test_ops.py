"""Each kernel-level fix: the mismatch with the fix off, exact equality with it on."""

from __future__ import annotations

import torch

from zkl import invariance
from zkl.models.config import ModelConfig, MoEConfig
from zkl.models.transformer import Qwen3MoE
from zkl.ops import fast, invariant


def test_gemm_rows_independent_of_batch():
    """fp32 torch.mm picks its kernel by M on this CPU; 16-row tiles make every row fixed."""
    torch.manual_seed(0)
    x, w = torch.randn(200, 64), torch.randn(96, 64)
    full_fast, full_inv = fast.linear(x, w, None), invariant.linear(x, w, None)
    fast_diff = inv_diff = 0
    for m in (1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 64, 100):
        for lo in (0, 3, 50):
            rows = slice(lo, lo + m)
            fast_diff += int((fast.linear(x[rows], w, None) != full_fast[rows]).any())
            inv_diff += int((invariant.linear(x[rows], w, None) != full_inv[rows]).any())
    assert fast_diff > 0
    assert inv_diff == 0


def test_gemm_bf16_rows_and_autograd():
    torch.manual_seed(1)
    x = torch.randn(37, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    out = invariant.linear(x, w, None)
    for i in range(37):
        assert torch.equal(invariant.linear(x[i : i + 1], w, None), out[i : i + 1])
    torch.testing.assert_close(out.float(), (x.float() @ w.float().t()), rtol=1e-2, atol=1e-2)
    grad = torch.randn(37, 32, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    out.backward(grad)
    # each row one bf16 GEMM with an fp32 accumulator, rounded once: one bf16 ulp (2^-7 of
    # the value) from the float64 product
    want = (grad.double() @ w.double()).to(torch.bfloat16)
    torch.testing.assert_close(x.grad, want, rtol=2**-7, atol=0)


def test_rms_norm_reduction_order():
    """A long row reduced alone is split across threads; in a batch it is not. Two threads,
    whatever the machine has or an earlier run in this process set (`zkl.threads`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _check_rms_norm_reduction_order()
    finally:
        torch.set_num_threads(before)


def _check_rms_norm_reduction_order():
    fast_diff = inv_diff = 0
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        x, w = torch.randn(4, 65536, generator=g), torch.rand(65536, generator=g) + 0.5
        fast_diff += not torch.equal(fast.rms_norm(x[:1], w, 1e-6), fast.rms_norm(x, w, 1e-6)[:1])
        alone, batch = invariant.rms_norm(x[:1], w, 1e-6), invariant.rms_norm(x, w, 1e-6)[:1]
        inv_diff += not torch.equal(alone, batch)
        torch.testing.assert_close(alone, fast.rms_norm(x[:1], w, 1e-6), rtol=1e-5, atol=1e-6)
    assert torch.get_num_threads() > 1, "the split needs more than one thread"
    assert fast_diff > 0
    assert inv_diff == 0


def test_ordered_sum_matches_sum_and_layout():
    torch.manual_seed(3)
    x = torch.randn(5, 300, dtype=torch.float64)
    torch.testing.assert_close(invariant.ordered_sum(x), x.sum(-1), rtol=1e-12, atol=1e-12)
    y = torch.randn(64, 300).t()  # non-contiguous rows
    assert torch.equal(invariant.ordered_sum(y), invariant.ordered_sum(y.contiguous()))


def _qkv(seq: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, seq, 16, generator=g).to(dtype)
    k = torch.randn(2, 2, seq, 16, generator=g).to(dtype)
    v = torch.randn(2, 2, seq, 16, generator=g).to(dtype)
    return q, k, v


def test_attention_decode_equals_prefill():
    """Decode (one query vs the cache) reduces keys differently from prefill unless fixed."""
    seq = 45
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = _qkv(seq, dtype)
        positions = torch.arange(seq).expand(2, seq)
        mismatch = {}
        for impl in (fast, invariant):
            prefill = impl.attention(q, k, v, positions)
            bad = 0
            for t in range(seq):
                # decode: the cache holds more (zeroed) room than the current length
                cache_k = torch.cat([k[:, :, : t + 1], torch.zeros_like(k)], dim=2)
                cache_v = torch.cat([v[:, :, : t + 1], torch.zeros_like(v)], dim=2)
                pos = torch.full((2, 1), t)
                out = impl.attention(q[:, :, t : t + 1], cache_k, cache_v, pos)
                bad += int(not torch.equal(out[:, :, 0], prefill[:, :, t]))
            mismatch[impl.__name__] = bad
        assert mismatch[fast.__name__] > 0, dtype
        assert mismatch[invariant.__name__] == 0, dtype


def test_attention_matches_sdpa():
    q, k, v = _qkv(40, torch.float32)
    positions = torch.arange(40).expand(2, 40)
    torch.testing.assert_close(
        invariant.attention(q, k, v, positions),
        fast.attention(q, k, v, positions),
        rtol=1e-5,
        atol=1e-6,
    )


def test_attention_chunked_prefill_equals_whole():
    q, k, v = _qkv(40, torch.bfloat16)
    whole = invariant.attention(q, k, v, torch.arange(40).expand(2, 40))
    part = invariant.attention(q[:, :, 23:], k, v, torch.arange(23, 40).expand(2, 17))
    assert torch.equal(part, whole[:, :, 23:])


def test_moe_combine_independent_of_dispatch_order():
    """Adding expert outputs in dispatch order (as GPU atomics do) changes bf16 results."""
    cfg = ModelConfig(
        family="qwen3_moe",
        moe=MoEConfig(num_experts=8, num_experts_per_tok=4, intermediate_size=32),
    )
    moe = Qwen3MoE(cfg)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    moe = moe.to(torch.bfloat16)
    x = torch.randn(64, cfg.hidden_size, generator=g).to(torch.bfloat16)
    orders = [list(range(8)), list(reversed(range(8))), [3, 1, 7, 0, 5, 2, 6, 4]]
    results = {}
    for fixed in (False, True):
        fixes = {"moe_combine_order", "batch_invariant_gemm"} if fixed else set()
        with invariance.enabled(fixes), torch.no_grad():
            outs = [moe(x, expert_order=o) for o in orders]
        results[fixed] = all(torch.equal(outs[0], o) for o in outs[1:])
    assert results[False] is False
    assert results[True] is True


def test_moe_router_tie_break_is_stable():
    cfg = ModelConfig(
        family="qwen3_moe",
        moe=MoEConfig(num_experts=4, num_experts_per_tok=2, intermediate_size=32),
    )
    moe = Qwen3MoE(cfg)
    with torch.no_grad():
        moe.gate.weight.zero_()  # every expert ties
    with invariance.enabled({"moe_combine_order"}):
        ids, weights = moe.route(torch.randn(5, cfg.hidden_size))
    assert torch.equal(ids, torch.tensor([[0, 1]] * 5))
    assert torch.equal(weights, torch.full((5, 2), 0.5))

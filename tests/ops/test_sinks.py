"""Attention sinks (gpt-oss): the CPU reference against the eager softmax with a sink column,
and the Triton kernels (interpreter, fp32 / fp16) with prefill == decode == scoring bitwise,
across chunk merges."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import INTERPRETED, NOT_INTERPRETED
from zkl import invariance, ops
from zkl.ops import fast, invariant

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _inputs(seq: int, dtype=torch.float32, seed: int = 11):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, seq, 16, generator=g).to(dtype) for h in (4, 2, 2))
    sinks = torch.randn(4, generator=g) * 2
    return q, k, v, sinks, torch.arange(seq).expand(2, seq)


def _eager(q, k, v, sinks, positions):
    """The sink as one more softmax column, in float64: the definition."""
    return fast.attention_with_sinks(
        q.double(), k.double(), v.double(), positions, sinks.double()
    ).float()


def test_reference_sinks_match_the_eager_definition_and_take_mass():
    q, k, v, sinks, positions = _inputs(40)
    got = invariant.attention(q, k, v, positions, sinks=sinks)
    torch.testing.assert_close(got, _eager(q, k, v, sinks, positions), **TOL)
    plain = invariant.attention(q, k, v, positions)
    assert not torch.equal(got, plain)  # the sink changes every output ...
    # ... by the factor of mass the keys keep: a very negative sink takes none
    none = invariant.attention(q, k, v, positions, sinks=torch.full((4,), -1e4))
    assert torch.equal(none, plain)


def test_reference_sinks_prefill_equals_decode_and_dispatch_passes_them():
    q, k, v, sinks, positions = _inputs(37)
    whole = invariant.attention(q, k, v, positions, sinks=sinks)
    for t in (0, 15, 16, 36):
        pos = torch.full((2, 1), t)
        one = invariant.attention(q[:, :, t : t + 1], k, v, pos, sinks=sinks)
        assert torch.equal(one[:, :, 0], whole[:, :, t])
    with invariance.enabled(invariance.FIXES):
        assert torch.equal(ops.attention(q, k, v, positions, sinks=sinks), whole)
    with invariance.enabled(()):
        fast_out = ops.attention(q, k, v, positions, sinks=sinks)
    torch.testing.assert_close(fast_out, whole, **TOL)


def test_reference_sinks_get_a_gradient():
    q, k, v, sinks, positions = _inputs(20)
    sinks.requires_grad_()
    invariant.attention(q, k, v, positions, sinks=sinks).square().sum().backward()
    got = sinks.grad.clone()
    sinks.grad = None
    fast.attention_with_sinks(q, k, v, positions, sinks).square().sum().backward()
    torch.testing.assert_close(got, sinks.grad, rtol=1e-4, atol=1e-5)


triton_only = pytest.mark.skipif(not INTERPRETED, reason=NOT_INTERPRETED)


@triton_only
@pytest.mark.parametrize(
    "dtype,window", [(torch.float32, 0), (torch.float16, 0), (torch.float32, 40)]
)
def test_kernel_sinks_prefill_decode_scoring_bitwise_across_chunk_merges(dtype, window):
    """Three chunks of 64 keys: scoring (whole prefill), prefill from the cache at an offset
    and split decode give the same bits with sinks, and the reference's numbers; with a
    window of 40 its edge crosses the chunk boundaries and whole chunks fall behind it."""
    attention = pytest.importorskip("zkl.ops.triton.attention")
    seq, chunk = 150, 64
    q, k, v, sinks, positions = _inputs(seq, dtype)
    tile = attention.REFERENCE
    extra = {"chunk": chunk, "sinks": sinks, "window": window}
    scored = attention.prefill(q, k, v, positions, tile=tile, **extra)
    want = invariant.attention(
        q.float(), k.float(), v.float(), positions, sinks=sinks, window=window
    )
    tol = TOL if dtype == torch.float32 else {"rtol": 2e-3, "atol": 2e-3}
    torch.testing.assert_close(scored.float(), want, **tol)
    cache_k, cache_v = (
        torch.zeros(3, 2, 160, 16, dtype=dtype),
        torch.zeros(3, 2, 160, 16, dtype=dtype),
    )
    rows = torch.tensor([2, 0])
    cache_k[rows, :, :seq], cache_v[rows, :, :seq] = k, v
    for t in (0, 63, 64, 100, 128, 149):
        pos = torch.full((2, 1), t)
        out = attention.decode(
            q[:, :, t : t + 1], cache_k, cache_v, pos, rows, rows_per_program=16, **extra
        )
        assert torch.equal(out[:, :, 0], scored[:, :, t]), t
    part = attention.prefill(
        q[:, :, 70:], cache_k, cache_v, positions[:, 70:], rows, tile=tile, **extra
    )
    assert torch.equal(part, scored[:, :, 70:])
    plain = attention.prefill(q, k, v, positions, tile=tile, chunk=chunk, window=window)
    assert not torch.equal(plain, scored)


@triton_only
def test_kernel_sinks_backward_and_default_path():
    attention = pytest.importorskip("zkl.ops.triton.attention")
    q, k, v, sinks, positions = _inputs(20)
    q, k, v, sinks = (t.clone().requires_grad_() for t in (q, k, v, sinks))
    attention.attention(q, k, v, positions, sinks=sinks).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v, sinks)]
    for t in (q, k, v, sinks):
        t.grad = None
    fast.attention_with_sinks(q, k, v, positions, sinks).square().sum().backward()
    for got, t in zip(grads, (q, k, v, sinks)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        default = attention.attention_default(q, k, v, positions, sinks=sinks)
        torch.testing.assert_close(default, _eager(q, k, v, sinks, positions), **TOL)


def test_reference_window_with_sinks_matches_the_eager_definition_across_the_edge():
    """Window 5 over 37 keys: the reference equals the eager mask, and one query decoded at a
    time equals the whole prefill bitwise on both sides of the window edge and of a block."""
    q, k, v, sinks, positions = _inputs(37)
    whole = invariant.attention(q, k, v, positions, sinks=sinks, window=5)
    want = fast.attention_with_sinks(
        q.double(), k.double(), v.double(), positions, sinks.double(), window=5
    ).float()
    torch.testing.assert_close(whole, want, **TOL)
    assert not torch.equal(whole, invariant.attention(q, k, v, positions, sinks=sinks))
    for t in (0, 4, 5, 15, 16, 20, 36):
        pos = torch.full((2, 1), t)
        one = invariant.attention(q[:, :, t : t + 1], k, v, pos, sinks=sinks, window=5)
        assert torch.equal(one[:, :, 0], whole[:, :, t]), t
    plain = invariant.attention(q, k, v, positions, window=5)
    torch.testing.assert_close(plain, fast.attention(q, k, v, positions, window=5), **TOL)

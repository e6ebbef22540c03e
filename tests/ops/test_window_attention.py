"""Sliding-window attention (`window` W: a query at p sees the keys p-W+1..p) on every form.

The CPU reference and SDPA agree with a brute-force softmax; the Triton kernels (run by the
interpreter at tiny shapes, fp32 and fp16) give scoring == prefill (two tile sizes, nested
or not) == prefill from the cache at an offset == decode bit for bit, across the window's
edge and across chunk merges, since every path counts chunks from position 0.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import INTERPRETED, NOT_INTERPRETED
from zkl.ops import fast, invariant

SEQ, CHUNK = 200, 128  # two chunks of the kernels (KEY_BLOCK 64)


def _qkv(dtype=torch.float32, seq=SEQ):
    g = torch.Generator().manual_seed(4)
    return tuple(torch.randn(2, h, seq, 16, generator=g).to(dtype) for h in (4, 2, 2))


def _brute(q, k, v, window):
    """softmax over the band (p-W, p] in float64."""
    seq = q.shape[2]
    at = torch.arange(seq)
    band = (at[None, :] <= at[:, None]) & (at[None, :] > at[:, None] - window)
    kk = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    vv = v.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = q.double() @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(s.masked_fill(~band, -torch.inf), -1) @ vv


@pytest.mark.parametrize("window", [1, 16, 70, 150])
def test_cpu_forms_match_a_brute_force_softmax_over_the_band(window):
    q, k, v = _qkv()
    positions = torch.arange(SEQ).expand(2, SEQ)
    want = _brute(q, k, v, window)
    for form in (invariant, fast):
        got = form.attention(q, k, v, positions, window=window)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_cpu_reference_scoring_prefill_and_decode_agree_bitwise():
    q, k, v = _qkv()
    window = 37  # the edge inside a 16-key block
    positions = torch.arange(SEQ).expand(2, SEQ)
    whole = invariant.attention(q, k, v, positions, window=window)
    cache_k, cache_v = torch.zeros(3, 2, 256, 16), torch.zeros(3, 2, 256, 16)
    rows = torch.tensor([2, 0])
    cache_k[rows, :, :SEQ], cache_v[rows, :, :SEQ] = k, v
    for t in (0, 36, 37, 38, 150, SEQ - 1):
        pos = torch.full((2, 1), t)
        one = invariant.attention(q[:, :, t : t + 1], cache_k, cache_v, pos, rows, window=window)
        assert torch.equal(one[:, :, 0], whole[:, :, t]), t
    part = invariant.attention(q[:, :, 90:], cache_k, cache_v, positions[:, 90:], rows, window)
    assert torch.equal(part, whole[:, :, 90:])


def test_a_window_wider_than_the_context_is_full_attention():
    q, k, v = _qkv()
    positions = torch.arange(SEQ).expand(2, SEQ)
    full = invariant.attention(q, k, v, positions)
    assert torch.equal(invariant.attention(q, k, v, positions, window=SEQ), full)
    assert torch.equal(invariant.attention(q, k, v, positions, window=10 * SEQ), full)


def _interpreter():
    pytest.importorskip("triton")
    if not INTERPRETED:
        pytest.skip(NOT_INTERPRETED)
    from zkl.ops.triton import attention

    return attention


@pytest.mark.parametrize(
    "dtype", [torch.float32, pytest.param(torch.float16, marks=pytest.mark.slow)]
)
def test_kernels_prefill_decode_and_scoring_agree_bitwise_across_edge_and_merge(dtype):
    """Window 70 over chunks of 128: queries 128..197 see keys of both chunks (a merge), the
    window's edge moves through the first chunk and then the second."""
    attention = _interpreter()
    window = 70
    q, k, v = _qkv(dtype)
    positions = torch.arange(SEQ).expand(2, SEQ)
    ref = attention.prefill(q, k, v, positions, chunk=CHUNK, window=window)
    want = _brute(q, k, v, window)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(ref.double(), want, rtol=tol, atol=tol)
    for nested in (False, True):
        tile = attention.Tile(64, 4, 2, nested=nested)
        big = attention.prefill(q, k, v, positions, tile=tile, chunk=CHUNK, window=window)
        assert torch.equal(big, ref), nested
    cache_k = torch.zeros(3, 2, 256, 16, dtype=dtype)
    cache_v = torch.zeros_like(cache_k)
    rows = torch.tensor([2, 0])
    cache_k[rows, :, :SEQ], cache_v[rows, :, :SEQ] = k, v
    for t in (70, 128, 199):
        pos = torch.full((2, 1), t)
        out = attention.decode(
            q[:, :, t : t + 1], cache_k, cache_v, pos, rows, chunk=CHUNK, window=window
        )
        assert torch.equal(out[:, :, 0], ref[:, :, t]), t
    part = attention.prefill(
        q[:, :, 100:], cache_k, cache_v, positions[:, 100:], rows, chunk=CHUNK, window=window
    )
    assert torch.equal(part, ref[:, :, 100:])


def test_kernels_window_wider_than_the_context_and_default_path():
    attention = _interpreter()
    q, k, v = _qkv(seq=80)
    positions = torch.arange(80).expand(2, 80)
    full = attention.prefill(q, k, v, positions, chunk=CHUNK)
    assert torch.equal(attention.prefill(q, k, v, positions, chunk=CHUNK, window=500), full)
    want = _brute(q, k, v, 30)
    got = attention.attention_default(q, k, v, positions, window=30)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    cache_k, cache_v = torch.zeros(2, 2, 96, 16), torch.zeros(2, 2, 96, 16)
    rows = torch.tensor([1, 0])
    cache_k[rows, :, :80], cache_v[rows, :, :80] = k, v
    out = attention.attention_default(q[:, :, 79:], cache_k, cache_v, positions[:, 79:], rows, 30)
    torch.testing.assert_close(out[:, :, 0].double(), want[:, :, 79], rtol=1e-5, atol=1e-5)


def test_train_path_backward_with_a_window_matches_the_brute_force():
    attention = _interpreter()
    q, k, v = (t.requires_grad_() for t in _qkv(seq=40))
    positions = torch.arange(40).expand(2, 40)
    attention.attention(q, k, v, positions, window=9).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    _brute(q, k, v, 9).float().square().sum().backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-4)

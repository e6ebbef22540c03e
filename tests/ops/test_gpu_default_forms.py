"""The default path's CUDA forms are a fast generator's: fused row-wise norms and the fastest
attention measured for each shape (`zkl.ops.fastest_attention`). Each stays close to the
reference maths; the attention's choice is one of the candidates, made once per shape, and a
CUDA graph captured after its warm-up replays that choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zkl import ops
from zkl.ops import fast, fastest_attention

pytestmark = pytest.mark.gpu
cuda = pytest.importorskip("zkl.ops.cuda")  # the Triton kernels
DEV = "cuda"


def _rows(*shape, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, generator=g).to(dtype)


def test_the_default_norms_are_the_fused_passes_and_close_to_torch():
    assert ops.TABLE["rms_norm"].cuda_fast == ops._Cuda("rms_norm_default")
    assert ops.TABLE["add_rms_norm"].cuda_fast == ops._Cuda("add_rms_norm_default")
    x, delta, w = _rows(300, 1536), _rows(300, 1536, seed=1), _rows(1536, seed=2)
    torch.testing.assert_close(cuda.rms_norm_default(x, w, 1e-6), fast.rms_norm(x, w, 1e-6))
    total, normed = cuda.add_rms_norm_default(x, delta, w, 1e-6)
    want_total, want_normed = fast.add_rms_norm(x, delta, w, 1e-6)
    assert torch.equal(total, want_total)  # the add rounds once either way
    torch.testing.assert_close(normed, want_normed)


def test_the_default_norm_has_torchs_gradient():
    x = _rows(64, 1536, dtype=torch.float32).requires_grad_()
    w = _rows(1536, seed=2, dtype=torch.float32).requires_grad_()
    cuda.rms_norm_default(x, w, 1e-6).square().sum().backward()
    got = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    fast.rms_norm(x, w, 1e-6).square().sum().backward()
    torch.testing.assert_close(got[0], x.grad)
    torch.testing.assert_close(got[1], w.grad)


def _decode_inputs(batch: int, context: int):
    q = _rows(batch, 1, 12, 128, seed=3).transpose(1, 2)  # [B, H, 1, D] over [B, 1, H, D]
    cache_k, cache_v = _rows(batch + 2, 2, context, 128, seed=4), _rows(batch + 2, 2, context, 128)
    rows = torch.arange(batch, device=DEV).flip(0) + 2  # not the identity: the slots
    positions = torch.randint(context // 2, context, (batch, 1), device=DEV)
    return q, cache_k, cache_v, positions, rows


def _reference(q, cache_k, cache_v, positions, rows):
    k, v = cache_k[rows], cache_v[rows]
    mask = fast.visible_keys(positions, k.shape[2]).unsqueeze(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("batch,context", [(1, 8192), (16, 2048), (64, 4096)])
def test_default_decode_is_a_measured_candidate_and_close_to_sdpa(batch, context):
    fastest_attention._CHOSEN.clear()
    args = _decode_inputs(batch, context)
    out = cuda.attention_default(*args)
    torch.testing.assert_close(out, _reference(*args), atol=2e-2, rtol=0)
    chosen = fastest_attention.chosen()
    name = chosen[("decode", batch, 1, context, False)]
    assert name in fastest_attention.candidates(args[0], args[4])
    cuda.attention_default(*args)
    assert fastest_attention.chosen() == chosen  # measured once per shape


def test_a_graph_replays_the_choice_its_warm_up_made():
    fastest_attention._CHOSEN.clear()
    q, cache_k, cache_v, positions, rows = _decode_inputs(16, 4096)
    with fast.static_shapes():  # the scheduler's warm-up, then its capture
        eager = cuda.attention_default(q, cache_k, cache_v, positions, rows)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = cuda.attention_default(q, cache_k, cache_v, positions, rows)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)  # the same form on the same inputs
    assert len(fastest_attention.chosen()) == 1


def test_the_default_train_forward_is_close_to_sdpa_and_differentiable():
    fastest_attention._CHOSEN.clear()
    q = _rows(2, 1000, 12, 128, seed=5).transpose(1, 2).detach().requires_grad_()
    k, v = (_rows(2, 2, 1000, 128, seed=s).requires_grad_() for s in (6, 7))
    pos = torch.arange(1000, device=DEV).expand(2, 1000)
    out = cuda.attention_default(q, k, v, pos)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=0)
    out.float().square().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert ("forward", 2, 1024, 1000, True) in fastest_attention.chosen()

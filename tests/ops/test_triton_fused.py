"""The fused decoder-layer kernels (RoPE + cache write, SiLU-mul, add + RMSNorm) and the
packed-head decode attention, run by Triton's interpreter on the CPU at tiny shapes.

RoPE is mul/mul/add in fp32, which NumPy rounds as torch does: the fused pass is checked
against the torch form with `torch.equal`. SiLU's exponential is NumPy's here (Triton's on a
GPU), so SiLU-mul is compared with a stated tolerance; tests/ops/test_gpu_fused.py makes the
bitwise claims on the device.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import INTERPRETED, NOT_INTERPRETED, rope_tables

pytest.importorskip("triton")
if not INTERPRETED:
    pytest.skip(NOT_INTERPRETED, allow_module_level=True)


from zkl.ops import fast  # noqa: E402
from zkl.ops.triton import attention, fused, rowwise  # noqa: E402

B, T, HQ, HKV, D = 3, 5, 4, 2, 16


def _projection(dtype: torch.dtype, seed: int = 0):
    """q, k, v [B, T, H, D] as views of one fused qkv_proj output (strided, as
    every path projects them), the rotary tables and positions that start past zero."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, (HQ + 2 * HKV) * D, generator=g).to(dtype)
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
    q, k, v = (t.view(B, T, -1, D) for t in (q, k, v))
    rope = rope_tables(D, 64, 10000.0)
    positions = torch.arange(T).expand(B, T) + torch.tensor([[0], [7], [30]])
    return q, k, v, rope, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_is_the_torch_form_bitwise(dtype):
    q, k, _, rope, positions = _projection(dtype)
    got_q, got_k = fused.rotary(q, k, rope.cos, rope.sin, positions)
    want_q, want_k = fast.rotary(q, k, rope.cos, rope.sin, positions)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    # and the [B, H, T, D] form megatron's spec calls is the same rotation
    assert torch.equal(rope(q.transpose(1, 2), positions).transpose(1, 2), want_q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_into_cache_writes_the_torch_forms_rows(dtype):
    q, k, v, rope, positions = _projection(dtype, seed=1)
    slots = torch.tensor([4, 0, 2])
    caches = [torch.full((5, HKV, 48, D), 7.0, dtype=dtype) for _ in range(4)]
    got_q = fused.rotary_into_cache(q, k, v, rope.cos, rope.sin, positions, *caches[:2], slots)
    want_q = fast.rotary_into_cache(q, k, v, rope.cos, rope.sin, positions, *caches[2:], slots)
    assert torch.equal(got_q, want_q)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert (caches[0][1] == 7.0).all()  # an untouched slot stays as it was


def test_rotary_refuses_tables_of_another_width():
    q, k, _, _, positions = _projection(torch.float32)
    narrow = rope_tables(D // 2, 64, 10000.0)
    with pytest.raises(ValueError, match="do not fit head_dim"):
        fused.rotary(q, k, narrow.cos, narrow.sin, positions)


def test_silu_mul_matches_torch_and_its_backward():
    g = torch.Generator().manual_seed(2)
    gate_up = torch.randn(2, 3, 2 * 1500, generator=g)  # > one block of columns, a strided view
    gate, up = gate_up.split(1500, dim=-1)
    got = fused.silu_mul(gate, up)
    # NumPy's exp against torch's: within an ulp or two of fp32
    torch.testing.assert_close(got, fast.silu_mul(gate, up), rtol=1e-6, atol=1e-6)
    gr, ur = gate.clone().requires_grad_(), up.clone().requires_grad_()
    fused.silu_mul(gr, ur).square().sum().backward()
    grads = gr.grad.clone(), ur.grad.clone()
    gr.grad = ur.grad = None
    fast.silu_mul(gr, ur).square().sum().backward()
    torch.testing.assert_close(grads[0], gr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[1], ur.grad, rtol=1e-5, atol=1e-5)
    assert fused.silu_mul(gate[:0], up[:0]).shape == (0, 3, 1500)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_is_the_add_then_the_norm_kernel_bitwise(dtype):
    g = torch.Generator().manual_seed(3)
    x, delta = (torch.randn(4, 3, 96, generator=g).to(dtype) for _ in range(2))
    weight = torch.rand(96, generator=g) + 0.5  # norms keep an fp32 weight
    total, normed = fused.add_rms_norm(x, delta, weight, 1e-6)
    assert torch.equal(total, x + delta)
    assert torch.equal(normed, rowwise.rms_norm(x + delta, weight, 1e-6))


def test_decode_attention_packs_the_group_and_keeps_each_rows_bits():
    """One query a row: the program's rows are the KV head's group of query heads; each row
    is bitwise the unpacked (whole-sequence) kernel's row, and the output is laid out
    [B, T, H, D] so the output projection reads it without a copy."""
    g = torch.Generator().manual_seed(4)
    seq = 70
    q = torch.randn(2, 6, seq, 16, generator=g)
    k, v = (torch.randn(2, 2, seq, 16, generator=g) for _ in range(2))
    positions = torch.arange(seq).expand(2, seq)
    whole = attention.attention(q, k, v, positions)
    assert whole.transpose(1, 2).is_contiguous()
    cache_k, cache_v = torch.zeros(3, 2, 80, 16), torch.zeros(3, 2, 80, 16)
    rows = torch.tensor([2, 0])
    cache_k[rows, :, :seq], cache_v[rows, :, :seq] = k, v
    for t in (0, 33, 64, 69):
        out = attention.attention(q[:, :, t : t + 1], cache_k, cache_v, torch.full((2, 1), t), rows)
        assert torch.equal(out[:, :, 0], whole[:, :, t])


def test_commit_samples_is_the_torch_bookkeeping():
    """One launch against the torch form: live, done and finishing rows, an EOS, a count at
    the output width (clamped column), rows in any slot order."""
    from zkl.generation.slots import SlotState
    from zkl.ops.triton import commit

    def state():
        s = SlotState(6, 4, torch.device("cpu"))
        s.done[:] = torch.tensor([False, True, False, False, False, True])
        s.count[:] = torch.tensor([0, 2, 3, 1, 4, 0])
        s.max_new[:] = torch.tensor([4, 4, 4, 2, 6, 4])
        s.pos[:] = torch.tensor([10, 11, 12, 13, 14, 15])
        s.token[:] = 7
        return s

    rows = torch.tensor([4, 0, 1, 3, 2])
    tokens = torch.tensor([5, 9, 8, 2, 3])
    logprobs = torch.tensor([-0.5, -1.5, -2.5, -3.5, -4.5])
    got, want = state(), state()
    commit.commit_samples(got, rows, tokens, logprobs, eos_id=9)
    fast.commit_samples(want, rows, tokens, logprobs, eos_id=9)
    for name in ("token", "pos", "count", "done", "out_tokens", "out_logprobs"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert want.done.tolist() == [True, True, True, True, False, True]  # eos, limits
    got, want = state(), state()
    commit.commit_samples(got, rows, tokens, logprobs, eos_id=None)
    fast.commit_samples(want, rows, tokens, logprobs, eos_id=None)
    assert torch.equal(got.done, want.done) and not want.done[0]

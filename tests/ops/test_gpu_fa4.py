"""flash-attn-4 as zero mode's attention on Hopper and newer: prefill == decode == scoring bit
for bit at the 1.5B's heads (12 q / 2 kv, d 128, bf16) up to 32k keys, every query of a 4k
sequence decoded alone, windows and sinks, batches of ragged decodes, the train forward and a
deterministic backward. Skipped without CUDA, flash-attn-4 or an sm90+ GPU."""

from __future__ import annotations

import pytest
import torch

from zkl.ops import fa4

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
if not fa4.usable(128, torch.bfloat16, torch.device("cuda")):
    pytest.skip("needs flash-attn-4 on an sm90+ GPU", allow_module_level=True)

cuda = pytest.importorskip("zkl.ops.cuda")
DEV = "cuda"
SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0, -3.0, 1.5] * 2)


def _qkv(batch: int, seq: int, seed: int, scale=(1.0, 1.0, 1.0)):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(batch, seq, 12, 128, device=DEV, generator=g) * scale[0]
    k = torch.randn(batch, 2, seq, 128, device=DEV, generator=g) * scale[1]
    v = torch.randn(batch, 2, seq, 128, device=DEV, generator=g) * scale[2]
    return q.bfloat16().transpose(1, 2), k.bfloat16(), v.bfloat16()


def _cache(k, v, slots: int, rows: torch.Tensor, extra: int = 64):
    cache_k = torch.zeros(slots, 2, k.shape[2] + extra, 128, device=DEV, dtype=torch.bfloat16)
    cache_v = torch.zeros_like(cache_k)
    cache_k[rows, :, : k.shape[2]], cache_v[rows, :, : k.shape[2]] = k, v
    return cache_k, cache_v


def test_flash_attn_4_serves_zero_mode_here():
    assert fa4.serves(128, torch.bfloat16, torch.device(DEV))


@pytest.mark.parametrize("window, sinks", [(0, None), (128, None), (0, SINKS), (128, SINKS)])
def test_every_query_decoded_alone_equals_scoring(window, sinks):
    """4,096 queries at a weight-like scale, each decoded alone from a cache slot, against
    one causal prefill: 6.3M outputs, not one bit apart."""
    seq = 4096
    q, k, v = _qkv(1, seq, seed=11, scale=(0.3, 0.3, 0.05))
    sinks = None if sinks is None else sinks.to(DEV)
    pos = torch.arange(seq, device=DEV)
    whole = cuda.attention(q, k, v, pos[None], window=window, sinks=sinks)[0]  # [H, T, D]
    cache_k, cache_v = _cache(k, v, 3, torch.tensor([1], device=DEV))
    slots = torch.ones(seq, dtype=torch.long, device=DEV)
    q_dec = q[0].transpose(0, 1).unsqueeze(2)  # [T, H, 1, D]
    one = cuda.attention(q_dec, cache_k, cache_v, pos[:, None], slots, window, sinks)
    assert int((one[:, :, 0].transpose(0, 1) != whole).sum()) == 0


def test_prefill_chunks_decode_and_scoring_agree_up_to_32k():
    seq = 32768
    q, k, v = _qkv(1, seq, seed=1)
    pos = torch.arange(seq, device=DEV).expand(1, seq)
    whole = cuda.attention(q, k, v, pos)
    rows = torch.tensor([2], device=DEV)
    cache_k, cache_v = _cache(k, v, 3, rows)
    for t in (0, 127, 128, 129, 4095, 4096, 10000, 16383, 16384, 32767):
        p = torch.full((1, 1), t, device=DEV)
        out = cuda.attention(q[:, :, t : t + 1], cache_k, cache_v, p, rows)
        assert torch.equal(out[:, :, 0], whole[:, :, t]), t
    for lo, hi in ((0, 700), (700, 1500), (5000, 9000), (32000, 32768)):
        p = torch.arange(lo, hi, device=DEV).expand(1, hi - lo)
        part = cuda.attention(q[:, :, lo:hi], cache_k, cache_v, p, rows)
        assert torch.equal(part, whole[:, :, lo:hi]), (lo, hi)
    qg, kg, vg = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    assert torch.equal(cuda.attention(qg, kg, vg, pos), whole)  # the train forward


def test_ragged_prefill_rows_and_a_batch_of_decodes_follow_no_other_row():
    """Rows of a right-padded prefill starting at different positions, and 64 decodes of
    ragged contexts in one call, against each row alone."""
    seq = 9000
    q, k, v = _qkv(8, seq, seed=2)
    rows = torch.arange(8, device=DEV)
    cache_k, cache_v = _cache(k, v, 8, rows, extra=100)
    g = torch.Generator(DEV).manual_seed(5)
    contexts = torch.randint(0, seq, (8, 1), device=DEV, generator=g)
    q_dec = q[rows, :, contexts[:, 0]].unsqueeze(2)
    together = cuda.attention(q_dec, cache_k, cache_v, contexts, rows)
    for r in range(8):
        alone = cuda.attention(
            q_dec[r : r + 1], cache_k, cache_v, contexts[r : r + 1], rows[r : r + 1]
        )
        assert torch.equal(alone, together[r : r + 1]), r
        whole = cuda.attention(
            q[r : r + 1], k[r : r + 1], v[r : r + 1], torch.arange(seq, device=DEV)[None]
        )
        assert torch.equal(together[r, :, 0], whole[0, :, contexts[r, 0]]), r
    starts = torch.tensor([0, 300, 4000, 8000], device=DEV)
    width = 600
    pos = starts[:, None] + torch.arange(width, device=DEV)
    chunk_q = torch.stack([q[r, :, s : s + width] for r, s in enumerate(starts.tolist())])
    # the scheduler's padded rows: a row that reaches the cache's end repeats its last position
    clamped = pos.clamp(max=8300)
    for positions in (pos, clamped):
        part = cuda.attention(chunk_q, cache_k, cache_v, positions, rows[:4])
        for r, s in enumerate(starts.tolist()):
            whole = cuda.attention(
                q[r : r + 1], k[r : r + 1], v[r : r + 1], torch.arange(seq, device=DEV)[None]
            )
            real = min(width, 8301 - s) if positions is clamped else width
            assert torch.equal(part[r, :, :real], whole[0, :, s : s + real]), r
            assert bool(part[r, :, real:].isfinite().all())


@pytest.mark.parametrize("window, sinks", [(0, None), (64, SINKS)])
def test_backward_is_deterministic_and_close_to_sdpa(window, sinks):
    q, k, v = _qkv(2, 1000, seed=4)
    pos = torch.arange(1000, device=DEV).expand(2, 1000)
    sinks = None if sinks is None else sinks.to(DEV)

    def grads():
        leaves = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
        s = None if sinks is None else sinks.clone().requires_grad_()
        cuda.attention(*leaves, pos, window=window, sinks=s).float().square().sum().backward()
        return [t.grad for t in leaves] + ([] if s is None else [s.grad])

    first, second = grads(), grads()
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    if sinks is None and not window:  # against SDPA's bf16 error, both from an fp32 reference

        def sdpa(dtype):
            leaves = [t.detach().to(dtype).contiguous().requires_grad_() for t in (q, k, v)]
            out = torch.nn.functional.scaled_dot_product_attention(
                *leaves, is_causal=True, enable_gqa=True
            )
            out.float().square().sum().backward()
            return [t.grad.float() for t in leaves]

        exact, bf16 = sdpa(torch.float32), sdpa(torch.bfloat16)
        for got, ref, peer in zip(first, exact, bf16):
            ours, theirs = (got.float() - ref).abs().max(), (peer - ref).abs().max()
            assert ours <= 2 * theirs, (ours.item(), theirs.item())


def test_close_to_sdpa_and_the_triton_kernels():
    from zkl.ops.triton import attention as triton_attention

    q, k, v = _qkv(2, 3000, seed=9)
    pos = torch.arange(3000, device=DEV).expand(2, 3000)
    got = cuda.attention(q, k, v, pos)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    torch.testing.assert_close(got, sdpa, atol=2e-2, rtol=0)  # bf16 outputs, |v| ~ 1
    torch.testing.assert_close(got, triton_attention.attention(q, k, v, pos), atol=2e-2, rtol=0)

"""The chunked invariant attention on the GPU: prefill == decode == scoring, bit for bit, for
sequences up to 32k keys, across chunk merges, query tiles, decode splits and batch sizes."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
attn = pytest.importorskip("zkl.ops.triton.attention")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

DEV = "cuda"


def _qkv(batch: int, seq: int, heads=(12, 2), dim=128, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(batch, seq, heads[0], dim, device=DEV, generator=g).bfloat16().transpose(1, 2)
    k, v = (
        torch.randn(batch, heads[1], seq, dim, device=DEV, generator=g).bfloat16() for _ in "kv"
    )
    return q, k, v


def _cache(k, v, slots: int, rows: torch.Tensor, extra: int = 64):
    cache_k = torch.zeros(slots, k.shape[1], k.shape[2] + extra, k.shape[3], device=DEV)
    cache_k = cache_k.bfloat16()
    cache_v = torch.zeros_like(cache_k)
    cache_k[rows, :, : k.shape[2]], cache_v[rows, :, : k.shape[2]] = k, v
    return cache_k, cache_v


def test_the_probe_finds_a_large_prefill_tile_that_decode_reproduces():
    """A large candidate tile, not the reference fallback, and a decode row count the probe
    tries; on Hopper the 128-query tile with 64-row decode, both the warpgroup MMA
    (docs/gpu.md)."""
    choice = attn.choose(128, torch.bfloat16, torch.device(DEV))
    assert choice.prefill in attn.PREFILL_TILES and choice.decode_rows in (attn.REF_M, 64), choice
    if torch.cuda.get_device_capability()[0] == 9:
        assert (choice.prefill.rows, choice.decode_rows) == (128, 64), choice


def test_prefill_decode_and_scoring_agree_bitwise_up_to_32k():
    seq = 32768
    q, k, v = _qkv(1, seq, seed=1)
    pos = torch.arange(seq, device=DEV).expand(1, seq)
    whole = attn.attention(q, k, v, pos)  # scoring: large tiles, chunks merged in registers
    rows = torch.tensor([2], device=DEV)
    cache_k, cache_v = _cache(k, v, 3, rows)
    for t in (0, 63, 64, 511, 512, 513, 4095, 4096, 10000, 16383, 16384, 32767):
        p = torch.full((1, 1), t, device=DEV)
        out = attn.attention(q[:, :, t : t + 1], cache_k, cache_v, p, rows)
        assert torch.equal(out[:, :, 0], whole[:, :, t]), t
    for lo, hi in ((0, 700), (700, 1500), (5000, 9000), (32000, 32768)):
        p = torch.arange(lo, hi, device=DEV).expand(1, hi - lo)
        part = attn.attention(q[:, :, lo:hi], cache_k, cache_v, p, rows)
        assert torch.equal(part, whole[:, :, lo:hi]), (lo, hi)
    qg, kg, vg = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    assert torch.equal(attn.attention(qg, kg, vg, pos), whole)  # the train forward


def _decode_every_query(q, k, v) -> torch.Tensor:
    """Each query of row 0 decoded alone (one decode row each, all reading slot 0), with the
    decode tile the scheduler runs: [H, T, D]."""
    seq = q.shape[2]
    at = torch.arange(seq, device=DEV)
    q_dec = q[0, :, at].unsqueeze(2).transpose(0, 1)  # [T, H, 1, D]
    slots = torch.zeros(seq, dtype=torch.long, device=DEV)
    return attn.attention(q_dec, k[:1], v[:1], at.view(-1, 1), slots)[:, :, 0].transpose(0, 1)


def test_decode_reproduces_every_query_of_scoring():
    """Decode == scoring at every one of 4,096 queries (6.3M outputs: one flipped rounding
    fails), at the 1.5B's heads and a weight-like scale."""
    q, k, v = _qkv(1, 4096, seed=11)
    q, k, v = q * 0.3, k * 0.3, v * 0.05
    pos = torch.arange(4096, device=DEV).expand(1, 4096)
    whole = attn.attention(q, k, v, pos)[0]
    assert int((_decode_every_query(q, k, v) != whole).sum()) == 0


def test_a_decode_tile_of_another_instruction_differs_from_scoring():
    """The fix off: decode's rows packed 16 to a program (mma.sync) against the large
    prefill tile (warpgroup MMA) flip a few roundings of the same inputs."""
    q, k, v = _qkv(1, 4096, seed=11)
    q, k, v = q * 0.3, k * 0.3, v * 0.05
    choice = attn.choose(128, torch.bfloat16, torch.device(DEV))
    assert choice.prefill.rows >= 64 and choice.decode_rows == 64
    at = torch.arange(4096, device=DEV)
    whole = attn.attention(q, k, v, at.expand(1, 4096))[0]
    q_dec = q[0, :, at].unsqueeze(2).transpose(0, 1)
    slots = torch.zeros(4096, dtype=torch.long, device=DEV)
    other = attn.decode(q_dec, k[:1], v[:1], at.view(-1, 1), slots, rows_per_program=16)
    assert int((other[:, :, 0].transpose(0, 1) != whole).sum()) > 0


def test_decode_bits_do_not_follow_the_batch_or_its_split():
    """A row alone and among 64 rows of other contexts (another split of the key range)."""
    seq = 9000
    q, k, v = _qkv(64, seq, seed=2)
    rows = torch.arange(64, device=DEV)
    cache_k, cache_v = _cache(k, v, 64, rows, extra=7000)
    contexts = torch.randint(
        0, seq, (64, 1), device=DEV, generator=torch.Generator(DEV).manual_seed(5)
    )
    contexts[5] = 8191
    q_dec = q[rows, :, contexts[:, 0]].unsqueeze(2)  # row r's query at its own position
    together = attn.attention(q_dec, cache_k, cache_v, contexts, rows)
    for r in (0, 5, 63):
        alone = attn.attention(
            q_dec[r : r + 1], cache_k, cache_v, contexts[r : r + 1], rows[r : r + 1]
        )
        assert torch.equal(alone, together[r : r + 1]), r
    whole = attn.attention(q[5:6], k[5:6], v[5:6], torch.arange(seq, device=DEV).expand(1, seq))
    assert torch.equal(together[5, :, 0], whole[0, :, 8191])


def test_the_default_path_is_close_but_its_decode_split_follows_the_batch():
    seq = 16384
    q, k, v = _qkv(1, seq, seed=3)
    pos = torch.arange(seq, device=DEV).expand(1, seq)
    whole = attn.attention_default(q, k, v, pos)
    torch.testing.assert_close(whole, attn.attention(q, k, v, pos), atol=2e-2, rtol=0)
    rows = torch.tensor([0], device=DEV)
    cache_k, cache_v = _cache(k, v, 1, rows)
    differ = 0
    for t in (3000, 9000, 16383):
        p = torch.full((1, 1), t, device=DEV)
        out = attn.attention_default(q[:, :, t : t + 1], cache_k, cache_v, p, rows)
        differ += int(not torch.equal(out[:, :, 0], whole[:, :, t]))
    assert differ > 0


def test_the_backward_is_flash_and_close_to_sdpa():
    q, k, v = (t.detach().contiguous().requires_grad_() for t in _qkv(2, 1000, seed=4))
    pos = torch.arange(1000, device=DEV).expand(2, 1000)
    attn.attention(q, k, v, pos).float().square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.float().square().sum().backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, atol=5e-2, rtol=5e-2)

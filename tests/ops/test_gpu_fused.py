"""The fused decoder-layer passes on CUDA (`python -m pytest -m gpu`): each gives the bits of
the unfused form it replaces. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import rope_tables
from zkl import invariance
from zkl.ops import fast

pytestmark = pytest.mark.gpu
cuda = pytest.importorskip("zkl.ops.cuda")
DEV = "cuda"
QWEN_1_5B = {"hidden": 1536, "heads": 12, "kv_heads": 2, "head_dim": 128, "inter": 8960}


def _projection(batch: int, seq: int, seed: int):
    cfg = QWEN_1_5B
    heads, kv, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    g = torch.Generator(device=DEV).manual_seed(seed)
    qkv = torch.randn(batch, seq, (heads + 2 * kv) * d, device=DEV, generator=g)
    q, k, v = (qkv * 4).to(torch.bfloat16).split([heads * d, kv * d, kv * d], dim=-1)
    q, k, v = (t.view(batch, seq, -1, d) for t in (q, k, v))
    rope = rope_tables(d, 32768, 1e6).to(DEV)
    start = torch.randint(0, 30000, (batch, 1), device=DEV, generator=g)
    return q, k, v, rope, start + torch.arange(seq, device=DEV)


@pytest.mark.parametrize("batch,seq", [(64, 1), (3, 300), (1, 17)])
def test_rotary_and_its_cache_write_are_the_torch_forms_bits(batch, seq):
    q, k, v, rope, positions = _projection(batch, seq, seed=seq)
    got = cuda.rotary(q, k, rope.cos, rope.sin, positions)
    want = fast.rotary(q, k, rope.cos, rope.sin, positions)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    slots = torch.randperm(batch + 3, device=DEV)[:batch]
    caches = [torch.zeros(batch + 3, 2, 32768, 128, device=DEV, dtype=torch.bfloat16)]
    caches = caches + [torch.zeros_like(caches[0]) for _ in range(3)]
    args = (q, k, v, rope.cos, rope.sin, positions)
    got_q = cuda.rotary_into_cache(*args, caches[0], caches[1], slots)
    want_q = fast.rotary_into_cache(*args, caches[2], caches[3], slots)
    assert torch.equal(got_q, want_q)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@pytest.mark.parametrize("dim", [1536, 2048, 896])
def test_add_rms_norm_is_the_add_then_the_invariant_norm(dim):
    g = torch.Generator(device=DEV).manual_seed(dim)
    x, delta = (torch.randn(1000, dim, device=DEV, generator=g).to(torch.bfloat16) for _ in "xd")
    weight = torch.rand(dim, device=DEV, generator=g) + 0.5
    total, normed = cuda.add_rms_norm(x, delta, weight, 1e-6)
    assert torch.equal(total, x + delta)
    assert torch.equal(normed, cuda.rms_norm(x + delta, weight, 1e-6))
    for rows in (1, 64, 257):  # one program per row: no row depends on the batch
        assert torch.equal(
            cuda.add_rms_norm(x[:rows], delta[:rows], weight, 1e-6)[1], normed[:rows]
        )


def test_silu_mul_rows_never_depend_on_the_batch_and_follow_torch():
    g = torch.Generator(device=DEV).manual_seed(5)
    gate_up = torch.randn(300, 2 * 8960, device=DEV, generator=g).to(torch.bfloat16)
    gate, up = gate_up.split(8960, dim=-1)
    full = cuda.silu_mul(gate, up)
    for rows in (1, 7, 64):
        assert torch.equal(cuda.silu_mul(gate[:rows], up[:rows]), full[:rows])
    # Triton's exponential, not torch's: the same within bf16's rounding (stated tolerance)
    torch.testing.assert_close(full, fast.silu_mul(gate, up), rtol=1e-2, atol=1e-2)


def test_decode_attention_reads_each_kv_head_once_with_the_same_bits():
    """Packed GQA decode (6 query heads a KV head) against the whole-sequence kernel."""
    g = torch.Generator(device=DEV).manual_seed(7)
    seq = 260
    q = torch.randn(4, 12, seq, 128, device=DEV, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(4, 2, seq, 128, device=DEV, generator=g).to(torch.bfloat16) for _ in "kv")
    whole = cuda.attention(q, k, v, torch.arange(seq, device=DEV).expand(4, seq))
    cache_k = torch.zeros(6, 2, seq + 4, 128, device=DEV, dtype=torch.bfloat16)
    cache_v = torch.zeros_like(cache_k)
    rows = torch.tensor([5, 0, 3, 1], device=DEV)
    cache_k[rows, :, :seq], cache_v[rows, :, :seq] = k, v
    for t in (0, 63, 64, 200, 259):
        pos = torch.full((4, 1), t, device=DEV)
        out = cuda.attention(q[:, :, t : t + 1], cache_k, cache_v, pos, rows)
        assert torch.equal(out[:, :, 0], whole[:, :, t]), t


def test_fused_projection_model_decode_equals_the_train_path():
    """A seeded Qwen2 (q/k/v bias, fused qkv_proj): zero mode's gen-path logits of every
    position equal the train path's (gradients on)."""
    from zkl.models.build import build_model
    from zkl.models.config import ModelConfig

    cfg = ModelConfig(family="qwen2", qkv_bias=True, num_hidden_layers=2)
    model = build_model(cfg, torch.bfloat16, seed=0, device=DEV)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)  # nonzero biases: the fused bias must add right too
    tokens = torch.randint(0, cfg.vocab_size, (3, 40), device=DEV)
    positions = torch.arange(40, device=DEV).expand(3, 40)
    with invariance.enabled(invariance.FIXES):
        train = model(tokens, positions)  # gradients on, as the update forward
        from zkl.generation.kv_cache import KVCache

        cache = KVCache(2, 3, cfg.num_key_value_heads, 64, cfg.head_dim, torch.bfloat16, DEV)
        slots = torch.arange(3, device=DEV)
        with torch.no_grad():
            prefill = model(tokens[:, :30], positions[:, :30], cache, slots)
            steps = [
                model(tokens[:, t : t + 1], positions[:, t : t + 1], cache, slots)
                for t in range(30, 40)
            ]
    assert torch.equal(prefill, train[:, :30].detach())
    assert torch.equal(torch.cat(steps, dim=1), train[:, 30:].detach())

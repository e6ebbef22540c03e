"""Nemotron-H hybrid: the Mamba2 chunk scan, the `mamba_chunked_decode` fix, the scheduler state."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from zkl import invariance, memory
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.models import mamba2
from zkl.models.build import build_model
from zkl.models.mamba2 import chunk_scan
from zkl.rl.loop import run
from zkl.trainer.scoring import score

ALL = invariance.FIXES
NO_MAMBA_FIX = frozenset(ALL) - {"mamba_chunked_decode"}


def _model(dtype=torch.float32, seed: int = 5):
    return build_model(make_cfg("model=tiny_hybrid").model, dtype, seed=seed)


def _requests(n: int, max_new: int = 12, prefix_len: int = 34):
    g = torch.Generator().manual_seed(1)
    prefix = [2 + (i * 7) % 50 for i in range(prefix_len)]  # a shared "system prompt"
    out = []
    for i in range(n):
        tail = torch.randint(2, 60, (int(torch.randint(1, 11, (1,), generator=g)),), generator=g)
        params = SamplingParams(max_new_tokens=max_new, seed=100 + i)
        out.append(Request(i, prefix + tail.tolist(), params))
    return out


def _gen_and_score(model, fixes, requests, **scheduler_kwargs):
    with invariance.enabled(fixes):
        scheduler = Scheduler(model, eos_id=None, **{"max_batch_size": 3, **scheduler_kwargs})
        done = scheduler.generate(requests)
        lp_train = score(model, [c.prompt for c in done], [c.tokens for c in done])
    return scheduler, done, lp_train


def test_chunk_scan_equals_recurrence():
    """The SSD chunk scan is the Mamba2 recurrence (up to rounding), across chunk boundaries."""
    g = torch.Generator().manual_seed(0)
    b, length, H, P, N, Q = 2, 13, 3, 4, 5, 4
    x, B, C = (torch.randn(b, 16, H, d, generator=g) for d in (P, N, N))
    dt = torch.rand(b, 16, H, generator=g) * 0.5
    dt[:, length:] = 0
    A = -torch.rand(H, generator=g) - 0.5
    h = torch.randn(b, H, P, N, generator=g)
    y, states = chunk_scan(x, dt, B, C, A, h, Q)
    for t in range(length):
        h = (
            torch.exp(dt[:, t] * A)[..., None, None] * h
            + (x[:, t] * dt[:, t, :, None])[..., None] * B[:, t, :, None]
        )
        torch.testing.assert_close(y[:, t], torch.einsum("bhpn,bhn->bhp", h, C[:, t]))
    torch.testing.assert_close(states[:, -1], h)


def test_chunk_scan_gradients_stay_finite_over_a_long_chunk():
    """Above the diagonal exp(cum[l] - cum[s]) overflows once a chunk spans enough decay
    (Nemotron-H's 128 positions do); it must not reach the gradients as inf * 0 = NaN."""
    g = torch.Generator().manual_seed(0)
    b, Q, H, P, N = 1, 128, 2, 4, 8
    x, B, C = (torch.randn(b, Q, H, d, generator=g, requires_grad=True) for d in (P, N, N))
    dt = (torch.rand(b, Q, H, generator=g) + 1.0).requires_grad_()  # sum over the chunk > 88
    A = torch.full((H,), -1.0, requires_grad=True)
    h = torch.zeros(b, H, P, N)
    y, _ = chunk_scan(x, dt, B, C, A, h, Q)
    y.sum().backward()
    for t in (x, B, C, dt, A):
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("chunks_per_piece", [1, 2, 5])
def test_chunk_scan_in_pieces_keeps_every_bit(monkeypatch, chunks_per_piece):
    """The train path builds its diagonal blocks a few chunks at a time (their products grow
    with batch x length: 17 GB at Nemotron-H's widths for 32 rows of one chunk); the output and
    the states are bitwise the one-piece scan's, the gradients equal to 1e-6 (their sums over
    the pieces are added in another order), and the pieces are taken."""
    g = torch.Generator().manual_seed(0)
    b, length, H, P, N, Q = 3, 32, 4, 8, 16, 8
    x, B, C = (torch.randn(b, length, H, d, generator=g, requires_grad=True) for d in (P, N, N))
    dt = (torch.rand(b, length, H, generator=g) * 0.5).requires_grad_()
    A, h = -torch.rand(H, generator=g) - 0.5, torch.randn(b, H, P, N, generator=g)
    weights = torch.randn(b, length, H, P, generator=g)

    def scan():
        y, states = chunk_scan(x, dt, B, C, A, h, Q)
        loss = (y * weights).sum() + states.sum()
        return y, states, torch.autograd.grad(loss, (x, dt, B, C))

    whole = scan()
    calls = []
    intra = mamba2._intra
    monkeypatch.setattr(mamba2, "_intra", lambda *a: calls.append(a[0].shape[0]) or intra(*a))
    monkeypatch.setattr(mamba2, "SCAN_PIECE_VALUES", chunks_per_piece * Q * Q * H * N)
    pieces = scan()
    assert calls == [
        min(chunks_per_piece, b * length // Q - i) for i in range(0, 12, chunks_per_piece)
    ]
    assert torch.equal(pieces[0], whole[0]) and torch.equal(pieces[1], whole[1])
    for got, want in zip(pieces[2], whole[2]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


def test_the_scan_estimate_does_not_grow_with_the_batch():
    """Nemotron-H's widths at 64 rollouts of 8k tokens: the scan's transient stays at two
    pieces' worth (about 2 GB), where the whole batch's blocks would be 550 TB."""
    m = make_cfg("model=nemotron3_nano_30b_a3b").model
    piece = mamba2.scan_piece_chunks(m.mamba.chunk_size, m.mamba.num_heads, m.mamba.state_size)
    one_chunk = (
        m.mamba.chunk_size**2 * m.mamba.num_heads * max(m.mamba.state_size, m.mamba.head_dim) * 4
    )
    assert memory.mamba_scan_bytes(m, 64, 8192) == 2.0 * piece * one_chunk <= 2 * 2**30
    assert memory.mamba_scan_bytes(m, 1, m.mamba.chunk_size) == 2.0 * one_chunk


def test_mamba_chunked_decode_fix():
    """Fix off: decode (the recurrence) differs from training; on: bitwise equal to it."""
    model = _model()
    requests = _requests(4)
    _, done, lp_train = _gen_and_score(model, NO_MAMBA_FIX, requests)
    lp_gen = torch.cat([c.logprobs for c in done])
    assert not torch.equal(lp_gen, torch.cat(lp_train))
    _, done, lp_train = _gen_and_score(model, ALL, requests)
    for c, t in zip(done, lp_train):
        assert torch.equal(c.logprobs, t)


def test_hybrid_engine_invariant_to_batching_and_prefill_chunk():
    """Batch 1 vs 3, prefill chunks of 5 tokens: the same tokens and logprob bits (bf16)."""
    model = _model(torch.bfloat16)
    requests = _requests(4, max_new=6)
    _, one, _ = _gen_and_score(model, ALL, requests, max_batch_size=1)
    _, many, lp_train = _gen_and_score(model, ALL, requests[::-1], prefill_chunk=5)
    lp_train = {c.request_id: t for c, t in zip(many, lp_train)}
    many = sorted(many, key=lambda c: c.request_id)
    for a, b in zip(one, many):
        assert a.tokens == b.tokens
        assert torch.equal(a.logprobs, b.logprobs)
        assert torch.equal(b.logprobs, lp_train[b.request_id])


def test_persist_prefix_hit_restores_mamba_state():
    """A prefix hit resumes at a chunk boundary with the stored state: same bits as a miss."""
    model = _model()
    requests = _requests(3, max_new=5)
    with invariance.enabled(ALL):
        scheduler = Scheduler(model, eos_id=None, max_batch_size=1, kv_mode="persist")
        first = scheduler.generate(requests)
        second = scheduler.generate(requests)
    assert scheduler.stats.prefix_hit_tokens == 3 * 32  # lcm(16, chunk 8) = 16: two blocks
    for a, b in zip(first, second):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)


@pytest.mark.slow
def test_grpo_hybrid_zero_every_step_and_mamba_fix_attributed(tmp_path):
    """Short GRPO on tiny_hybrid (persist kv, refits): zero every step; the fix off alone: not."""
    common = ["model=tiny_hybrid", "kv=persist", "rl.steps=3", *SMALL]
    zero = run(make_cfg(*common), tmp_path / "zero")
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in zero)
    assert all(r["optim/update_norm"] > 0 for r in zero)
    off = run(make_cfg(*common, "fixes.mamba_chunked_decode=false"), tmp_path / "off")
    assert any(r["train/max_abs_logprob_diff"] > 0 for r in off)


@pytest.mark.gpu
def test_mamba_chunked_decode_fix_cuda():
    model = build_model(make_cfg("model=tiny_hybrid").model, torch.bfloat16, seed=5, device="cuda")
    _, done, lp_train = _gen_and_score(model, ALL, _requests(4))
    for c, t in zip(done, lp_train):
        assert torch.equal(c.logprobs.cpu(), t.cpu())


@pytest.mark.gpu
def test_chunk_scan_in_pieces_on_cuda_at_nemotron_widths(monkeypatch):
    """At Nemotron-H's widths (64 heads, P 64, N 128, Q 128) eight chunks are 4.3 GB of
    products in one piece; in the default pieces (two chunks) the output and the states are
    bitwise the one piece's, and the gradients are the same run to run."""
    g = torch.Generator(device="cuda").manual_seed(0)
    b, length, H, P, N, Q = 4, 256, 64, 64, 128, 128

    def rand(*shape):
        return torch.randn(*shape, generator=g, device="cuda")

    x, B, C = (rand(b, length, H, d).requires_grad_() for d in (P, N, N))
    dt = (torch.rand(b, length, H, generator=g, device="cuda") * 0.1).requires_grad_()
    A, h = -torch.rand(H, generator=g, device="cuda") - 0.5, rand(b, H, P, N)

    def scan():
        y, states = chunk_scan(x, dt, B, C, A, h, Q)
        return y, states, torch.autograd.grad(y.sum() + states.sum(), (x, dt, B, C))

    assert mamba2.scan_piece_chunks(Q, H, N) == 2
    pieces, again = scan(), scan()
    assert all(torch.equal(p, a) for p, a in zip(pieces[2], again[2]))
    monkeypatch.setattr(mamba2, "SCAN_PIECE_VALUES", 8 * Q * Q * H * N)
    whole = scan()
    assert torch.equal(pieces[0], whole[0]) and torch.equal(pieces[1], whole[1])


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_update_estimate_holds_what_the_scan_keeps(checkpointing):
    """The tensors the chunk scan keeps for the backward, counted through autograd's
    saved-tensor hooks at the tiny hybrid's widths and a long sequence, are what
    `memory.mamba_saved_bytes` says, up to one state and the causal mask per layer."""
    cfg = make_cfg("model=tiny_hybrid", f"trainer.activation_checkpointing={checkpointing}")
    m = cfg.model
    b, n, Q = 2, 16, m.mamba.chunk_size
    H, P, N = m.mamba.num_heads, m.mamba.head_dim, m.mamba.state_size
    g = torch.Generator().manual_seed(0)
    x, B, C = (torch.randn(b, n * Q, H, d, generator=g, requires_grad=True) for d in (P, N, N))
    dt = (torch.rand(b, n * Q, H, generator=g) * 0.5).requires_grad_()
    A, h = -torch.rand(H, generator=g) - 0.5, torch.zeros(b, H, P, N)
    given = {t.untyped_storage().data_ptr() for t in (x, dt, B, C, A, h)}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in given:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunk_scan(x, dt, B, C, A, h, Q)
    mamba_layers = 1 if checkpointing else m.hybrid_override_pattern.count("M")
    estimate = memory.mamba_saved_bytes(cfg, b, n * Q - 3)  # padded to whole chunks
    one_state, causal_mask = b * H * P * N * 4, Q * Q
    assert 0 <= sum(kept.values()) - estimate / mamba_layers <= one_state + causal_mask
    assert memory.mamba_saved_bytes(make_cfg("model=tiny_moe"), b, n * Q) == 0.0

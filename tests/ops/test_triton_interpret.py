"""The CUDA kernels' logic, run by Triton's interpreter on the CPU at tiny shapes (fp32).

The interpreter computes `tl.dot` with NumPy, one row at a time
(tests/helpers/interpreter_dot.py), so bitwise claims about the GPU are not made here
(tests/ops/test_gpu.py makes them on the device); these check indexing, masking, the online
softmax, strides, the KV-row indirection and the backward passes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import INTERPRETED, NOT_INTERPRETED

pytest.importorskip("triton")
if not INTERPRETED:
    pytest.skip(NOT_INTERPRETED, allow_module_level=True)

from zkl.ops import fast  # noqa: E402
from zkl.ops.triton import attention, gemm, rowwise  # noqa: E402

TOL = {"rtol": 1e-5, "atol": 1e-5}


def test_interpreted_dot_gives_a_row_the_same_bits_wherever_it_sits():
    """Row 15 of a 16-row tile, the same row at index 0 and alone: one `np.matmul` gives the
    row alone other bits on every OpenBLAS kernel (and row 0 other bits on Haswell and Zen);
    the interpreter's `tl.dot` as the tests install it gives all three the same."""
    import triton.language as tl
    from interpreter_dot import row_by_row
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    dot = InterpreterBuilder.create_dot
    assert dot.row_by_row  # conftest installed it
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 64), dtype=np.float32)
    b = TensorHandle(rng.standard_normal((64, 16), dtype=np.float32), tl.float32)

    def placements(create_dot):
        def run(x):
            acc = TensorHandle(np.zeros((len(x), 16), np.float32), tl.float32)
            return create_dot(None, TensorHandle(x, tl.float32), b, acc, "ieee", None).data

        return run(a)[15], run(np.roll(a, 1, axis=0))[0], run(a[15:])[0]

    in_tile, first, alone = placements(dot.whole)
    assert not (np.array_equal(in_tile, first) and np.array_equal(in_tile, alone))
    in_tile, first, alone = placements(row_by_row(dot.whole))
    assert np.array_equal(in_tile, first) and np.array_equal(in_tile, alone)


def test_gemm_matches_torch_with_bias_and_ragged_tiles():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(37, 70, generator=g), torch.randn(45, 70, generator=g), torch.randn(45)
    torch.testing.assert_close(gemm.linear(x, w, b), x @ w.t() + b, **TOL)
    x3 = torch.randn(2, 3, 70, generator=g)
    torch.testing.assert_close(gemm.linear(x3, w, None), x3 @ w.t(), **TOL)
    assert gemm.linear(x[:0], w, None).shape == (0, 45)


def test_gemm_backward():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 40, generator=g, requires_grad=True)
    w = torch.randn(33, 40, generator=g, requires_grad=True)
    b = torch.randn(33, generator=g, requires_grad=True)
    gemm.linear(x, w, b).square().sum().backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    (x @ w.t() + b).square().sum().backward()
    for got, t in zip(grads, (x, w, b)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-4)


def test_rms_norm_and_softmax_match_torch():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(4, 5, 48, generator=g), torch.rand(48, generator=g) + 0.5
    torch.testing.assert_close(rowwise.rms_norm(x, w, 1e-6), fast.rms_norm(x, w, 1e-6), **TOL)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    rowwise.rms_norm(xr, wr, 1e-6).square().sum().backward()
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    rms64 = torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6)
    (x64 * rms64 * w64).square().sum().backward()  # float64 autograd: the reference gradient
    torch.testing.assert_close(xr.grad, x64.grad.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wr.grad, w64.grad.float(), rtol=1e-4, atol=1e-4)
    s = torch.randn(7, 12, generator=g)
    torch.testing.assert_close(rowwise.softmax(s), torch.softmax(s, -1), **TOL)


def test_token_logprobs_on_a_sliced_view_and_backward():
    """The train path hands over logits[:, :-1] of [B, T, V] without a copy."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 6, 9000, generator=g, requires_grad=True)  # > one 4096 block
    tokens = torch.randint(0, 9000, (3, 5), generator=g)
    temps = torch.tensor([1.0, 0.7, 1.3]).reshape(-1, 1, 1)
    got = rowwise.token_logprobs(logits[:, :-1], tokens, temps)
    want = fast.token_logprobs(logits[:, :-1], tokens, temps)
    torch.testing.assert_close(got, want, **TOL)
    got.sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    want.sum().backward()
    torch.testing.assert_close(grad, logits.grad, **TOL)


def _qkv(seq: int):
    g = torch.Generator().manual_seed(4)
    return tuple(torch.randn(2, h, seq, 16, generator=g) for h in (4, 2, 2))


def test_attention_matches_sdpa_for_prefill_decode_and_cache_rows():
    seq = 70  # two key blocks of 64
    q, k, v = _qkv(seq)
    positions = torch.arange(seq).expand(2, seq)
    whole = attention.attention(q, k, v, positions)
    torch.testing.assert_close(whole, fast.attention(q, k, v, positions), **TOL)
    cache_k, cache_v = torch.zeros(4, 2, 80, 16), torch.zeros(4, 2, 80, 16)
    rows = torch.tensor([3, 1])
    cache_k[rows, :, :seq], cache_v[rows, :, :seq] = k, v
    for t in (0, 15, 63, 64, 69):
        pos = torch.full((2, 1), t)
        out = attention.attention(q[:, :, t : t + 1], cache_k, cache_v, pos, rows)
        torch.testing.assert_close(out[:, :, 0], whole[:, :, t], **TOL)
    part = attention.attention(q[:, :, 30:], cache_k, cache_v, positions[:, 30:], rows)
    torch.testing.assert_close(part, whole[:, :, 30:], **TOL)


def test_attention_backward_matches_sdpa():
    q, k, v = (t.clone().requires_grad_() for t in _qkv(20))
    positions = torch.arange(20).expand(2, 20)
    attention.attention(q, k, v, positions).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    fast.attention(q, k, v, positions).square().sum().backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_attention_chunk_merges_agree_across_paths_tiles_and_splits():
    """Three chunks of 128 keys: prefill at two tile sizes, split decode with any number of
    chunks a program, and chunked prefill from the cache give one answer (SDPA's)."""
    seq, chunk = 300, 128
    q, k, v = _qkv(seq)
    positions = torch.arange(seq).expand(2, seq)
    want = fast.attention(q, k, v, positions)
    ref = attention.prefill(q, k, v, positions, tile=attention.REFERENCE, chunk=chunk)
    torch.testing.assert_close(ref, want, **TOL)
    for nested in (False, True):
        tile = attention.Tile(64, 4, 2, nested=nested)
        big = attention.prefill(q, k, v, positions, tile=tile, chunk=chunk)
        torch.testing.assert_close(big, ref, **TOL)
    cache_k, cache_v = torch.zeros(3, 2, 320, 16), torch.zeros(3, 2, 320, 16)
    rows = torch.tensor([2, 0])
    cache_k[rows, :, :seq], cache_v[rows, :, :seq] = k, v
    for t in (0, 127, 128, 200, 255, 256, 299):
        pos = torch.full((2, 1), t)
        out = attention.decode(q[:, :, t : t + 1], cache_k, cache_v, pos, rows, chunk=chunk)
        torch.testing.assert_close(out[:, :, 0], ref[:, :, t], **TOL)
    part = attention.prefill(q[:, :, 100:], cache_k, cache_v, positions[:, 100:], rows, chunk=chunk)
    torch.testing.assert_close(part, ref[:, :, 100:], **TOL)


def test_decode_split_covers_every_chunk_once():
    """Each program takes whole chunks; the grid covers every chunk of the buffer."""
    for rows, heads, chunks, sms in ((1, 2, 64, 132), (64, 2, 32, 132), (256, 8, 1, 132)):
        per = attention.decode_split(rows, heads, chunks, sms)
        assert per >= 1 and -(-chunks // per) * per >= chunks


def test_default_attention_on_the_interpreter_matches_sdpa():
    seq = 150
    q, k, v = _qkv(seq)
    positions = torch.arange(seq).expand(2, seq)
    want = fast.attention(q, k, v, positions)
    torch.testing.assert_close(attention.attention_default(q, k, v, positions), want, **TOL)
    cache_k, cache_v = torch.zeros(2, 2, 160, 16), torch.zeros(2, 2, 160, 16)
    rows = torch.tensor([1, 0])
    cache_k[rows, :, :seq], cache_v[rows, :, :seq] = k, v
    pos = torch.full((2, 1), 149)
    out = attention.attention_default(q[:, :, 149:], cache_k, cache_v, pos, rows)
    torch.testing.assert_close(out[:, :, 0], want[:, :, 149], **TOL)


def test_gemm_tiles_follow_m_and_the_fixed_tile_follows_the_weight_only():
    assert gemm.fixed_config(1024, 1024, torch.bfloat16) == gemm.LARGE_16
    assert gemm.fixed_config(1024, 256, torch.bfloat16) == gemm.SMALL_16
    assert gemm.fixed_config(8960, 1536, torch.float32) == gemm.FP32
    bf16 = torch.bfloat16
    assert gemm.config_for(1, 1536, 2048, bf16) == gemm.DECODE_NARROW
    assert gemm.config_for(64, 8960, 1536, bf16) == gemm.DECODE_SLIM
    assert gemm.config_for(64, 1536, 8960, bf16) == gemm.DECODE_MID
    assert gemm.config_for(64, 1536, 151936, bf16) == gemm.DECODE_WIDE
    assert gemm.config_for(256, 8960, 1536, bf16) == gemm.DECODE_MID
    assert gemm.config_for(256, 1536, 17920, bf16) == gemm.MID_WIDE
    assert gemm.config_for(8192, 1536, 1536, torch.float16) == gemm.TRAIN
    assert gemm.config_for(8192, 1536, 1536, torch.float32) == gemm.FP32
    with pytest.raises(TypeError, match="bf16, fp16 and fp32"):
        gemm.config_for(1, 64, 64, torch.float64)


def test_every_tile_and_form_computes_the_product():
    """Pointer and TMA loads, one tile per program and persistent, with a bias, on a shape no
    tile divides and rows past the last tile (interpreter, fp16: NumPy has no bf16). The
    interpreter's dot is NumPy's, so bitwise claims are the GPU tests'."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(131, 264, generator=g).to(torch.float16)
    w = (torch.randn(200, 264, generator=g) * 0.05).to(torch.float16)
    bias = torch.randn(200, generator=g).to(torch.float16)
    ref = (x.float() @ w.float().t() + bias.float()).to(torch.float16).float()
    configs = (
        gemm.DECODE_SLIM,
        gemm.DECODE_NARROW,
        gemm.DECODE_WIDE,
        gemm.MID_WIDE,
        gemm.TRAIN,
        gemm.SMALL_16,
    )
    for config in configs:
        for tma in (False, True):
            got = gemm._product(x, w, bias, config, tma).float()
            assert (got - ref).abs().max() <= 0.05, (config, tma)
    assert gemm._tma_ok(x, w) and not gemm._tma_ok(x[:, 1:])  # a 2-byte offset: pointer form


def test_tiles_disagreeing_on_a_device_pin_one_tile(monkeypatch):
    """Where some tile gives other bits, the first call warns and that shape keeps the fixed
    tile for every M; where all agree, M picks the tile."""
    calls = []
    real = gemm._product

    def product(x, w, bias, config, tma):
        calls.append(config)
        out = real(x, w, bias, config, tma)
        return out + 1 if config == gemm.DECODE_SLIM else out  # this tile "differs"

    monkeypatch.setattr(gemm, "_product", product)
    monkeypatch.setattr(gemm, "_AGREES", {})
    x = torch.randn(3, 72).to(torch.float16)
    w = torch.randn(40, 72).to(torch.float16)
    with pytest.warns(UserWarning, match="keeps one tile for every batch size"):
        gemm.gemm(x, w)
    assert calls[-1] == gemm.fixed_config(72, 40, torch.float16)
    assert not gemm.tiles_agree(72, 40, torch.float16, x.device)
    monkeypatch.setattr(gemm, "_AGREES", {(72, 40, torch.float16, "cpu", ()): True})
    gemm.gemm(x, w)
    assert calls[-1] == gemm.DECODE_SLIM


def test_a_disagreeing_group_tile_pins_the_grouped_gemm_to_the_fixed_tile(monkeypatch):
    """If the grouped kernel's 16-row tile gave other bits than the fixed tile on a device,
    the grouped GEMM runs the fixed tile there; where it agrees, it runs the 16-row tile."""
    from zkl.ops.triton import grouped_gemm

    real = gemm._product

    def product(x, w, bias, config, tma):
        out = real(x, w, bias, config, tma)
        return out + 1 if config == grouped_gemm.SMALL_GROUPS else out  # this tile "differs"

    used = []
    monkeypatch.setattr(gemm, "_product", product)
    monkeypatch.setattr(gemm, "_AGREES", {})
    monkeypatch.setattr(grouped_gemm, "_apply", lambda x, ws, offs, config: used.append(config))
    x, weights, offsets = _grouped_problem([3, 0, 5], torch.float16)
    with pytest.warns(UserWarning, match="keeps one tile"):
        grouped_gemm.grouped_linear(x, weights, offsets)
    assert used[-1] == gemm.fixed_config(32, 48, torch.float16)
    monkeypatch.setattr(gemm, "_product", real)
    monkeypatch.setattr(gemm, "_AGREES", {})
    grouped_gemm.grouped_linear(x, weights, offsets)
    assert used[-1] == grouped_gemm.SMALL_GROUPS


def test_gemm_tile_override_computes_the_same_product():
    """`gemm(config=...)` (the bench's tile candidates) runs the given tiles: every candidate
    indexes and masks right on a shape no tile divides (interpreter, fp16)."""
    from zkl.lab.bench_gemm import TILE_CANDIDATES

    g = torch.Generator().manual_seed(1)
    x = torch.randn(70, 200, generator=g).to(torch.float16)
    w = (torch.randn(150, 200, generator=g) * 0.05).to(torch.float16)
    ref = (x.float() @ w.float().t()).to(torch.float16).float()
    for config in TILE_CANDIDATES[-3:]:  # the small tiles: the interpreter is slow
        got = gemm.gemm(x, w, config=config).float()
        assert (got - ref).abs().max() <= 0.05, config


@pytest.mark.slow
def test_fused_gumbel_argmax_is_the_torch_sampler():
    """The fused key-hash-noise-argmax pass picks torch's token: ragged vocab (no part or
    block divides it), rows split across parts, first-index ties (+inf twice), an all -inf
    row, seeds past 2^32 (the key's high word), and the temperature divided in the pass."""
    from zkl.ops.triton import sampling

    vocab = 3 * sampling.BLOCK + 77
    scores = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0)) * 3
    scores[1, [1500, 2100, vocab - 1]] = float("inf")
    scores[2] = float("-inf")
    seeds, counters = torch.tensor([0, 1, 2, 2**40 + 3]), torch.tensor([0, 5, 2**33, 1])
    fused = sampling.gumbel_argmax(scores, seeds, counters)
    assert torch.equal(fused, fast.gumbel_argmax(scores, seeds, counters))
    assert fused.tolist()[1:3] == [1500, 0]
    temps = torch.tensor([0.7, 1.0, 1.3, 0.01])
    logits = scores.to(torch.float16)  # the raw logits, divided in fp32 inside the pass
    assert torch.equal(
        sampling.gumbel_argmax(logits, seeds, counters, temps),
        fast.gumbel_argmax(logits, seeds, counters, temps),
    )
    zero = torch.zeros(4, dtype=torch.int64)
    many = torch.stack([sampling.gumbel_argmax(scores, seeds * 0 + s, zero) for s in range(20)])
    reference = torch.stack([fast.gumbel_argmax(scores, seeds * 0 + s, zero) for s in range(20)])
    assert torch.equal(many, reference) and many[:, 0].unique().numel() > 1
    assert sampling.gumbel_argmax(scores[:0], seeds[:0], zero[:0]).shape == (0,)


def _grouped_problem(sizes: list[int], dtype: torch.dtype = torch.float32, seed: int = 6):
    """Experts' weights [N=48, K=32] and rows grouped by `sizes` (x, weights, offsets)."""
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(48, 32, generator=g).to(dtype) for _ in sizes]
    x = torch.randn(sum(sizes), 32, generator=g).to(dtype)
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    return x, weights, offsets


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_gemm_rows_equal_each_experts_own_gemm(dtype):
    """Group sizes 0, 1 and across the 16-, 32- and 64-row tile edges, empty groups first and
    last; each group equals its expert's dense GEMM at the same tile, bit for bit, and the
    product itself (fp16: the interpreter computes bf16 tl.dot wrongly, the same wrong
    numbers at every tile, so a bf16 check here could not fail)."""
    from zkl.ops.triton import grouped_gemm

    small = [gemm.DECODE_SLIM, gemm.SMALL_16, grouped_gemm.SMALL_GROUPS]
    configs = [gemm.FP32] if dtype == torch.float32 else small
    for sizes in ([0, 33, 1, 64], [5, 0, 0, 70], [31, 32, 65, 0]):
        x, weights, offsets = _grouped_problem(sizes, dtype)
        bounds = offsets.tolist()
        for config in configs:
            out = grouped_gemm.grouped_gemm(x, weights, offsets, config)
            for e, w in enumerate(weights):
                rows = x[bounds[e] : bounds[e + 1]]
                want = (rows.float() @ w.float().t()).to(dtype)
                torch.testing.assert_close(out[bounds[e] : bounds[e + 1]], want)
                assert torch.equal(
                    out[bounds[e] : bounds[e + 1]], gemm._product(rows, w, None, config, tma=False)
                ), (sizes, e, config)
        if dtype == torch.float32:  # the public forms: the dense `linear`'s rows
            for form in (grouped_gemm.grouped_linear, grouped_gemm.grouped_linear_default):
                out = form(x, weights, offsets)
                for e, w in enumerate(weights):
                    want = gemm.linear(x[bounds[e] : bounds[e + 1]], w, None)
                    assert torch.equal(out[bounds[e] : bounds[e + 1]], want)


def test_grouped_tile_follows_the_mean_group_size():
    """16-row tiles while groups are decode-sized (up to 64 rows an expert on average), the
    dense GEMM's tile for that many rows beyond; fp32 keeps its one tile."""
    from zkl.ops.triton import grouped_gemm

    bf16 = torch.bfloat16
    assert grouped_gemm.group_tile(64 * 8, 128, 2048, 1536, bf16) == grouped_gemm.SMALL_GROUPS
    assert grouped_gemm.group_tile(64 * 128, 128, 2048, 1536, bf16) == grouped_gemm.SMALL_GROUPS
    wide = grouped_gemm.group_tile(64 * 128 + 1, 128, 2048, 1536, bf16)
    assert wide == gemm.config_for(64 * 128 + 1, 2048, 1536, bf16) == gemm.TRAIN
    assert grouped_gemm.group_tile(8, 4, 32, 48, torch.float32) == gemm.FP32


def test_grouped_gemm_row_ignores_the_other_groups():
    """Expert 2's rows keep their bits whatever the other groups hold (sizes 0 to 70)."""
    from zkl.ops.triton import grouped_gemm

    x, weights, offsets = _grouped_problem([3, 9, 20, 4])
    mine = x[12:32]
    g = torch.Generator().manual_seed(8)
    want = grouped_gemm.grouped_linear(x, weights, offsets)[12:32]
    for before, after in ((0, 0), (70, 1), (1, 64), (33, 0)):
        others = torch.randn(before + after, 32, generator=g)
        rows = torch.cat([others[:before], mine, others[before:]])
        offs = torch.tensor([0, before, before, before + 20, before + 20 + after])
        got = grouped_gemm.grouped_linear(rows, weights, offs)[before : before + 20]
        assert torch.equal(got, want), (before, after)


def test_grouped_gemm_backward():
    from zkl.ops.triton import grouped_gemm

    x, weights, offsets = _grouped_problem([4, 0, 7, 2])
    x.requires_grad_()
    for w in weights:
        w.requires_grad_()
    grouped_gemm.grouped_linear(x, weights, offsets).square().sum().backward()
    got = [t.grad.clone() for t in (x, *weights)]
    for t in (x, *weights):
        t.grad = None
    bounds = offsets.tolist()
    torch.cat(
        [x[lo:hi] @ w.t() for w, lo, hi in zip(weights, bounds[:-1], bounds[1:])]
    ).square().sum().backward()
    for grad, t in zip(got, (x, *weights)):
        torch.testing.assert_close(grad, t.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk", [8, 6])
def test_ssd_commit_kernel_moves_only_the_filled_rows_with_the_train_paths_bits(chunk):
    """The Mamba chunk commit on the device (`zkl.ops.triton.ssd`): the rows whose chunk filled
    get the train path's `ssd.commit` bit for bit (elementwise fp32 and the same pairwise
    tree, also over a chunk that is not a power of two), every other slot keeps its bits."""
    from zkl.ops import ssd
    from zkl.ops.triton import ssd as kernel

    g = torch.Generator().manual_seed(3)
    slots_n, heads, width, depth, rows = 6, 3, 10, 12, 4
    state = torch.randn(slots_n, heads, width, depth, generator=g)
    B = torch.randn(rows, 1, chunk, heads, depth, generator=g)
    cum = -torch.rand(rows, 1, chunk, heads, generator=g).cumsum(2)
    xdt = torch.randn(rows, 1, chunk, heads, width, generator=g)
    slots = torch.tensor([3, 0, 5, 1])
    full = torch.tensor([True, False, True, True])
    want = state.clone()
    want[slots[full]] = ssd.commit(state[slots[full]], B[full], cum[full], xdt[full])
    got = state.clone()
    to_end = torch.exp(cum[:, :, -1:] - cum)[:, 0]
    kernel.commit_rows_(got, slots, full, B[:, 0], to_end, xdt[:, 0], torch.exp(cum[:, 0, -1]))
    assert torch.equal(got, want)
    assert torch.equal(got[[2, 4]], state[[2, 4]]) and torch.equal(got[0], state[0])
    assert not torch.equal(got[3], state[3])  # the commit did run

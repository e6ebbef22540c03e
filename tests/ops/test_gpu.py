"""The fixes on CUDA: each shows the mismatch with it off (where the GPU has one) and exact
zero with it on, on the H200 (`python -m pytest -m gpu`). Skipped without a CUDA device."""

from __future__ import annotations

import glob
import os

import pytest
import torch
import yaml

from tests.conftest import SMALL, bench_cfg, make_cfg
from zkl import invariance
from zkl.generation.sampling import SamplingParams, sample
from zkl.generation.scheduler import Request, Scheduler
from zkl.models.build import build_model
from zkl.models.config import ModelConfig, MoEConfig
from zkl.models.transformer import Qwen3MoE
from zkl.ops import fast
from zkl.rl.loop import run
from zkl.run.schema import CONF_DIR
from zkl.trainer.scoring import score

pytestmark = pytest.mark.gpu
cuda = pytest.importorskip("zkl.ops.cuda")  # the Triton kernels
DEV = "cuda"
ROWS = (1, 2, 3, 5, 8, 13, 16, 31, 64, 100, 257, 1000)


def gemm_shapes(cfg: dict) -> set[tuple[int, int]]:
    """(K, N) of every Linear of a model config: attention, MLP or experts, router, lm_head."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {(h, q), (h, kv), (q, h), (h, cfg["vocab_size"])}
    inter = [cfg["intermediate_size"]]
    if cfg.get("num_experts"):
        inter.append(cfg["moe_intermediate_size"])
    for i in inter:
        shapes |= {(h, i), (i, h)}
    return shapes


def row_mismatches(linear, x: torch.Tensor, w: torch.Tensor) -> int:
    """How many (M, offset) sub-batches give a row different from the full batch's."""
    full = linear(x, w, None)
    bad = 0
    for m in ROWS:
        for lo in (0, 7):
            if lo + m <= x.shape[0]:
                bad += int(not torch.equal(linear(x[lo : lo + m], w, None), full[lo : lo + m]))
    return bad


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(CONF_DIR, "model", "*.yaml"))))
def test_gemm_invariant_over_every_model_shape(path):
    """Every GEMM shape of every conf/model config, M from 1 to 1000: rows never change."""
    with open(path) as f:
        cfg = yaml.safe_load(f)
    g = torch.Generator(device=DEV).manual_seed(0)
    for depth, width in sorted(gemm_shapes(cfg)):
        x = torch.randn(1007, depth, device=DEV, generator=g).to(torch.bfloat16)
        w = (torch.randn(width, depth, device=DEV, generator=g) * 0.02).to(torch.bfloat16)
        assert row_mismatches(cuda.linear, x, w) == 0, (depth, width)
    # the router runs in fp32
    if cfg.get("num_experts"):
        x = torch.randn(300, cfg["hidden_size"], device=DEV, generator=g)
        w = torch.randn(cfg["num_experts"], cfg["hidden_size"], device=DEV, generator=g)
        assert row_mismatches(cuda.linear, x, w) == 0


def test_gemm_fix_off_depends_on_rows():
    """cuBLAS picks split-K by M at large K (steering probe: 32 of 91 cases)."""
    g = torch.Generator(device=DEV).manual_seed(1)
    bad = 0
    for depth, width in ((8960, 1536), (6144, 2048), (4096, 4096)):
        x = torch.randn(1007, depth, device=DEV, generator=g).to(torch.bfloat16)
        w = torch.randn(width, depth, device=DEV, generator=g).to(torch.bfloat16)
        bad += row_mismatches(fast.linear, x, w)
    assert bad > 0


def test_gemm_matches_cublas_numerically():
    x = torch.randn(333, 1536, device=DEV).to(torch.bfloat16)
    w = torch.randn(8960, 1536, device=DEV).to(torch.bfloat16)
    b = torch.randn(8960, device=DEV).to(torch.bfloat16)
    torch.testing.assert_close(cuda.linear(x, w, b), fast.linear(x, w, b), rtol=2e-2, atol=0.5)


@pytest.mark.parametrize("dim", [128, 1536, 2048])
def test_rms_norm_rows_invariant(dim):
    x = torch.randn(1007, dim, device=DEV).to(torch.bfloat16)
    w = torch.rand(dim, device=DEV) + 0.5
    assert row_mismatches(lambda a, b, _: cuda.rms_norm(a, w, 1e-6), x, None) == 0
    torch.testing.assert_close(cuda.rms_norm(x, w, 1e-6), fast.rms_norm(x, w, 1e-6))


def test_vocab_logprobs_rows_invariant():
    """The fp32 log-softmax over the 151,936-token vocabulary: a row alone == in a batch."""
    logits = torch.randn(300, 151936, device=DEV).to(torch.bfloat16) * 4
    tokens = torch.randint(0, 151936, (300,), device=DEV)
    full = cuda.token_logprobs(logits, tokens, 0.7)
    for m in ROWS[:-1]:
        assert torch.equal(cuda.token_logprobs(logits[:m], tokens[:m], 0.7), full[:m])
    torch.testing.assert_close(full, fast.token_logprobs(logits, tokens, 0.7))
    # the train path's [B, T-1, V] slice of [B, T, V] logits gives the same bits
    cube = logits[:200].reshape(10, 20, -1)
    rows_tokens = tokens[:200].reshape(10, 20)[:, :-1]
    sliced = cuda.token_logprobs(cube[:, :-1], rows_tokens, 0.7)
    as_rows = cuda.token_logprobs(logits[:200], tokens[:200], 0.7).reshape(10, 20)[:, :-1]
    assert torch.equal(sliced, as_rows)


def test_fp32_gemm_rounds_as_fp32_in_both_forms():
    """Triton's `tl.dot` takes fp32 inputs as TF32 (10 mantissa bits) unless told otherwise;
    both GEMM forms (pointer and TMA) are told. TF32 is ~100x further from float64 here."""
    from zkl.ops.triton import gemm

    g = torch.Generator(device=DEV).manual_seed(3)
    x = torch.randn(300, 4096, device=DEV, generator=g)
    w = torch.randn(1024, 4096, device=DEV, generator=g) * 0.05
    exact = x.double() @ w.double().T
    for tma in (False, True):
        err = (gemm._product(x, w, None, gemm.FP32, tma).double() - exact).abs().max().item()
        assert err < 1e-4, (tma, err)
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        tf32 = ((x @ w.T).double() - exact).abs().max().item()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    assert tf32 > 1e-4  # the tolerance tells TF32 from fp32


def _qkv(seq: int, heads=(12, 2), dim=128):
    g = torch.Generator(device=DEV).manual_seed(4)
    q = torch.randn(3, heads[0], seq, dim, device=DEV, generator=g).to(torch.bfloat16)
    k = torch.randn(3, heads[1], seq, dim, device=DEV, generator=g).to(torch.bfloat16)
    v = torch.randn(3, heads[1], seq, dim, device=DEV, generator=g).to(torch.bfloat16)
    return q, k, v


def test_attention_decode_and_chunks_equal_train_forward():
    seq = 300
    q, k, v = _qkv(seq)
    positions = torch.arange(seq, device=DEV).expand(3, seq)
    bad = {}
    for name, impl in (("fast", fast), ("cuda", cuda)):
        whole = impl.attention(q, k, v, positions)
        cache_k = torch.zeros(5, 2, seq + 40, 128, device=DEV, dtype=torch.bfloat16)
        cache_v = torch.zeros_like(cache_k)
        rows = torch.tensor([4, 0, 2], device=DEV)
        cache_k[rows, :, :seq], cache_v[rows, :, :seq] = k, v
        count = 0
        for t in (0, 1, 15, 16, 63, 64, 65, 200, 299):
            pos = torch.full((3, 1), t, device=DEV)
            out = impl.attention(q[:, :, t : t + 1], cache_k, cache_v, pos, rows)
            count += int(not torch.equal(out[:, :, 0], whole[:, :, t]))
        for lo, hi in ((0, 37), (37, 100), (100, 300)):
            pos = torch.arange(lo, hi, device=DEV).expand(3, hi - lo)
            part = impl.attention(q[:, :, lo:hi], cache_k, cache_v, pos, rows)
            count += int(not torch.equal(part, whole[:, :, lo:hi]))
        bad[name] = count
    assert bad["fast"] > 0
    assert bad["cuda"] == 0
    torch.testing.assert_close(
        cuda.attention(q, k, v, positions), fast.attention(q, k, v, positions), atol=2e-2, rtol=0
    )


def _causal_attention_grads64(q, k, v) -> list[torch.Tensor]:
    """d/d(q, k, v) of sum(attention^2), causal with grouped KV heads, by float64 autograd
    on the CPU: the reference the kernels' gradients are held to."""
    q, k, v = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    groups, seq = q.shape[1] // k.shape[1], q.shape[2]
    kf, vf = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    scores = q @ kf.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    (scores.softmax(-1) @ vf).square().sum().backward()
    return [q.grad, k.grad, v.grad]


def test_attention_backward_matches_float64():
    """fp32 kernels against float64: 1e-4 holds their rounding over 40 keys, and a wrong
    scale, mask or KV-head sum is off by far more."""
    q, k, v = (t.float().requires_grad_() for t in _qkv(40, (4, 2), 64))
    positions = torch.arange(40, device=DEV).expand(3, 40)
    cuda.attention(q, k, v, positions).square().sum().backward()
    want = _causal_attention_grads64(q, k, v)
    for got, ref in zip((q.grad, k.grad, v.grad), want, strict=True):
        torch.testing.assert_close(got.cpu().double(), ref, rtol=1e-4, atol=1e-4)


def test_moe_grouped_combine_invariant_on_gpu():
    cfg = ModelConfig(
        family="qwen3_moe",
        hidden_size=256,
        moe=MoEConfig(num_experts=16, num_experts_per_tok=4, intermediate_size=128),
    )
    moe = Qwen3MoE(cfg).to(DEV)
    g = torch.Generator(device=DEV).manual_seed(5)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, device=DEV, generator=g) * 0.1)
    moe = moe.to(torch.bfloat16)
    x = torch.randn(200, 256, device=DEV, generator=g).to(torch.bfloat16)
    result = {}
    for fixed in (False, True):
        fixes = invariance.FIXES if fixed else set()
        with invariance.enabled(fixes), torch.no_grad():
            full = moe(x)
            parts = torch.cat([moe(x[:7]), moe(x[7:50]), moe(x[50:])])
            reordered = moe(x, expert_order=list(reversed(range(16))))
        result[fixed] = torch.equal(full, parts) and torch.equal(full, reordered)
    assert result[True] is True
    assert result[False] is False


def test_sampling_on_device_is_row_independent_and_matches_cpu():
    logits = torch.randn(64, 151936, device=DEV) * 3
    seeds = torch.arange(64, device=DEV) * 7919
    counters = torch.arange(64, device=DEV) % 5
    temps = torch.full((64,), 0.9, device=DEV)
    full = sample(logits, seeds, counters, temps)
    for lo, hi in ((0, 1), (5, 6), (10, 40)):
        alone = sample(logits[lo:hi], seeds[lo:hi], counters[lo:hi], temps[lo:hi])
        assert torch.equal(alone, full[lo:hi])
    on_cpu = sample(logits.cpu(), seeds.cpu(), counters.cpu(), temps.cpu())
    assert (on_cpu == full.cpu()).float().mean().item() >= 0.98
    # the fused Triton pass (what `sample` runs on CUDA) against the torch ops on the GPU
    unfused = fast.gumbel_argmax(logits / temps.unsqueeze(-1), seeds, counters)
    assert (unfused == full).float().mean().item() >= 0.98
    # the temperature divided inside the pass: the processed scores' tokens, bitwise
    divided = cuda.gumbel_argmax(logits.to(torch.bfloat16), seeds, counters, temps)
    assert torch.equal(divided, sample(logits.to(torch.bfloat16), seeds, counters, temps))


def test_seeded_init_is_identical_on_cpu_and_gpu():
    cfg = make_cfg("model=tiny_moe").model
    cpu = build_model(cfg, torch.bfloat16, seed=3)
    gpu = build_model(cfg, torch.bfloat16, seed=3, device=DEV)
    for (name, a), (_, b) in zip(cpu.named_parameters(), gpu.named_parameters()):
        assert torch.equal(a, b.cpu()), name


@pytest.mark.parametrize(
    ("name", "graphs"), [("tiny_moe", "off"), ("tiny_dense", "off"), ("tiny_dense", "on")]
)
def test_engine_zero_mode_on_gpu_any_schedule(name, graphs):
    cfg = make_cfg(f"model={name}")
    model = build_model(cfg.model, torch.bfloat16, seed=1, device=DEV)
    g = torch.Generator().manual_seed(0)
    requests = [
        Request(
            i,
            torch.randint(2, 60, (int(n),), generator=g).tolist(),
            SamplingParams(max_new_tokens=7, seed=i),
        )
        for i, n in enumerate(torch.randint(3, 40, (11,), generator=g))
    ]
    outs = []
    with invariance.enabled(invariance.FIXES):
        for batch, chunk, sync in ((1, 0, 1), (4, 5, 3), (11, 16, 8)):
            scheduler = Scheduler(
                model,
                max_batch_size=batch,
                eos_id=1,
                prefill_chunk=chunk,
                sync_every=sync,
                cuda_graphs=graphs,
            )
            done = scheduler.generate(requests)
            lp_train = score(model, [c.prompt for c in done], [c.tokens for c in done])
            for c, lp in zip(done, lp_train):
                assert torch.equal(c.logprobs, lp)
            outs.append([(c.tokens, c.logprobs) for c in done])
    for other in outs[1:]:
        for (t0, l0), (t1, l1) in zip(outs[0], other):
            assert t0 == t1 and torch.equal(l0, l1)


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe", "tiny_hybrid"])
@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
def test_grpo_zero_on_gpu_and_default_not(tmp_path, model, precision):
    common = [f"model={model}", f"+precision={precision}", "device=cuda", "rl.steps=3", *SMALL]
    zero = run(make_cfg(*common, "kv=persist"), tmp_path / "zero")
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in zero)
    assert all(r["optim/update_norm"] > 0 for r in zero)
    default = run(make_cfg(*common, "zero_train_gen_mismatch=false"), tmp_path / "default")
    assert all(r["train/max_abs_logprob_diff"] > 0.0 for r in default)


@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
def test_grpo_zero_with_cuda_graphs_on(tmp_path, layout, precision):
    """The whole loop with decode replayed from CUDA graphs: refits keep (bf16) or recapture
    (mxfp8) the graphs, and every step is still exactly zero, in both kv modes."""
    common = ["model=tiny_dense", f"+precision={precision}", "device=cuda", "rl.steps=3", *SMALL]
    common += ["scheduler.cuda_graphs=on"] + (
        ["+layout=dedicated"] if layout == "dedicated" else []
    )
    for kv in ("recompute", "persist"):
        rows = run(make_cfg(*common, f"kv={kv}"), tmp_path / kv)
        assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows), kv
        assert all(r["optim/update_norm"] > 0 for r in rows), kv


def test_dedicated_cuda_ipc_equals_colocated(tmp_path):
    common = ["model=tiny_dense", "device=cuda", "rl.steps=3", *SMALL]
    colocated = run(make_cfg(*common), tmp_path / "c")
    dedicated = run(make_cfg(*common, "+layout=dedicated"), tmp_path / "d")
    keys = [k for k in colocated[0] if k.startswith(("train/", "reward/", "optim/"))]
    for a, b in zip(colocated, dedicated):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
        assert b["train/max_abs_logprob_diff"] == 0.0


def test_tiles_agree_on_this_device_and_rows_are_m_invariant():
    """On Hopper every tile and form (pointer or TMA loads, persistent or not) gives the fixed
    tile's bits, so the tile follows M; rows never depend on M across the M buckets at 4096^3
    and the 1.5B's shapes (the deepest, the widest)."""
    from zkl.ops.triton import gemm

    g = torch.Generator(device=DEV).manual_seed(2)
    for depth, width in ((4096, 4096), (8960, 1536), (1536, 8960), (1536, 151936)):
        assert gemm.tiles_agree(depth, width, torch.bfloat16, torch.device(DEV)), (depth, width)
        x = torch.randn(1007, depth, device=DEV, generator=g).to(torch.bfloat16)
        w = (torch.randn(width, depth, device=DEV, generator=g) * 0.02).to(torch.bfloat16)
        assert row_mismatches(cuda.linear, x, w) == 0, (depth, width)
        full = gemm.gemm(x, w)
        for config in gemm._candidates(depth, width, torch.bfloat16) | {gemm.SMALL_16}:
            for tma in (False, True):
                assert torch.equal(gemm._product(x, w, None, config, tma), full), (config, tma)


def test_hybrid_bench_on_cuda_times_the_mamba_fix(tmp_path):
    """On CUDA a hybrid's bench is its decode with `mamba_chunked_decode` on vs off, not the
    dense CUDA table (whose graphs a Mamba decode cannot use)."""
    from zkl.lab.bench import run_bench

    result = run_bench(bench_cfg("model=tiny_hybrid", "device=cuda", *SMALL), tmp_path)
    assert result["ratio/decode_time_mamba_fix_on_over_off"] > 0
    assert result["zero_without_mamba_fix/decode_tokens_per_s"] > 0

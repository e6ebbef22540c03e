"""MoE on CUDA: the grouped expert GEMM's rows are the dense GEMM's, the layer reads nothing
back to the host, and MoE decode runs in CUDA graphs with the trainer's bits.
Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_cfg
from zkl import invariance
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.models.build import build_model
from zkl.trainer.scoring import score

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from zkl.ops.triton import gemm, grouped_gemm  # noqa: E402  (CUDA only)

DEV = "cuda"
EXPERTS, HIDDEN, EXPERT_WIDTH = 128, 2048, 768  # Qwen3-30B-A3B


@pytest.mark.parametrize("depth,width", [(HIDDEN, EXPERT_WIDTH), (EXPERT_WIDTH, HIDDEN)])
def test_grouped_gemm_equals_each_experts_own_gemm_at_every_group_size(depth, width):
    """gate/up ([768, 2048]) and down ([2048, 768]) in bf16: a group of every size 0..512
    (beside groups of other sizes) gives each row the dense invariant GEMM's bits."""
    g = torch.Generator(device=DEV).manual_seed(0)
    weights = [
        (torch.randn(width, depth, device=DEV, generator=g) * 0.02).to(torch.bfloat16)
        for _ in range(EXPERTS)
    ]
    rows = torch.randn(512 + 4 * EXPERTS, depth, device=DEV, generator=g).to(torch.bfloat16)
    sizes = torch.randint(0, 5, (EXPERTS,), generator=torch.Generator().manual_seed(1))
    sizes[4] = sizes[6] = 0  # idle experts beside the one under test
    bad = []
    with invariance.enabled(invariance.FIXES), torch.no_grad():
        for size in range(513):
            counts = sizes.clone()
            counts[5] = size
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
            x = rows[: int(offsets[-1])]
            out = grouped_gemm.grouped_linear(x, weights, offsets.to(DEV))
            bounds = offsets.tolist()
            for e in (3, 5, 6, EXPERTS - 1):
                lo, hi = bounds[e], bounds[e + 1]
                if not torch.equal(out[lo:hi], gemm.linear(x[lo:hi], weights[e], None)):
                    bad.append((size, e))
    assert bad == [], f"{len(bad)} groups differ from their dense GEMM, first {bad[:3]}"


def test_grouped_gemm_row_ignores_the_other_groups_on_the_device():
    g = torch.Generator(device=DEV).manual_seed(2)
    weights = [
        (torch.randn(EXPERT_WIDTH, HIDDEN, device=DEV, generator=g) * 0.02).to(torch.bfloat16)
        for _ in range(8)
    ]
    mine = torch.randn(9, HIDDEN, device=DEV, generator=g).to(torch.bfloat16)
    with invariance.enabled(invariance.FIXES), torch.no_grad():
        alone = grouped_gemm.grouped_linear(
            mine, weights, torch.tensor([0, 0, 0, 9, 9, 9, 9, 9, 9], device=DEV)
        )
        for before, after in ((1, 0), (63, 64), (500, 3), (0, 1000)):
            others = torch.randn(before + after, HIDDEN, device=DEV, generator=g).to(mine.dtype)
            x = torch.cat([others[:before], mine, others[before:]])
            cut = [0, before // 2, before, before + 9, before + 9 + after // 3]
            offsets = torch.tensor(cut + [before + 9 + after] * 4, device=DEV)
            got = grouped_gemm.grouped_linear(x, weights, offsets)[before : before + 9]
            assert torch.equal(got, alone), (before, after)


def _moe_layer(name: str, **overrides):
    extra = [f"model.{k}={v}" for k, v in overrides.items()]
    model = build_model(make_cfg(f"model={name}", *extra).model, torch.bfloat16, seed=0, device=DEV)
    return model, model.layers[0].mlp


def test_moe_layer_reads_nothing_back_and_captures_in_a_graph():
    """The layer's forward, fixes on and off, recorded in a CUDA graph (a host read would
    raise during capture) and replayed with new inputs: the eager bits."""
    _, moe = _moe_layer("tiny_moe")
    x = torch.randn(64, moe.gate.weight.shape[1], device=DEV).to(torch.bfloat16)
    for fixes in (invariance.FIXES, set()):
        with invariance.enabled(fixes), torch.no_grad():
            static = x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                moe(static)  # warm-up: kernels compiled, address tables built
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = moe(static)
            for seed in (1, 2):
                fresh = torch.randn(
                    x.shape, device=DEV, generator=torch.Generator(device=DEV).manual_seed(seed)
                ).to(x.dtype)
                static.copy_(fresh)
                graph.replay()
                assert torch.equal(out, moe(fresh)), (fixes, seed)


def test_padding_rows_cannot_change_a_real_row():
    """Zero mode: a token's MoE output is the same whatever fills the rest of the batch
    (a graph bucket's padding rows route to any experts, with any counts)."""
    _, moe = _moe_layer("qwen3_30b_a3b", num_hidden_layers=1)
    g = torch.Generator(device=DEV).manual_seed(3)
    real = torch.randn(5, 2048, device=DEV, generator=g).to(torch.bfloat16)
    with invariance.enabled(invariance.FIXES), torch.no_grad():
        want = moe(real)
        for pad in (0, 3, 59, 251):
            padding = torch.randn(pad, 2048, device=DEV, generator=g).to(real.dtype)
            assert torch.equal(moe(torch.cat([real, padding]))[:5], want), pad
            assert torch.equal(moe(torch.cat([padding, real]))[pad:], want), pad
            assert torch.equal(moe(torch.cat([real, real[:1].expand(pad, -1)]))[:5], want), pad


def _requests(n: int, vocab: int, seed: int = 0) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(3, 40, (1,), generator=g))
        prompt = torch.randint(2, vocab, (length,), generator=g)
        max_new = int(torch.randint(2, 12, (1,), generator=g))
        params = SamplingParams(max_new_tokens=max_new, seed=i)
        out.append(Request(i, prompt.tolist(), params))
    return out


@pytest.mark.parametrize(
    "name,overrides",
    [("tiny_moe", {}), ("qwen3_30b_a3b", {"num_hidden_layers": 2})],
    ids=["tiny_moe", "qwen3_30b_a3b_2_layers"],
)
def test_moe_decode_in_graphs_equals_eager_and_scoring(name, overrides):
    model, _ = _moe_layer(name, **overrides)
    requests = _requests(23, vocab=min(model.cfg.vocab_size, 5000))
    with invariance.enabled(invariance.FIXES), torch.no_grad():
        eager = Scheduler(model, max_batch_size=1, eos_id=None, cuda_graphs="off")
        expected = eager.generate(requests)
        trained = score(model, [c.prompt for c in expected], [c.tokens for c in expected])
        for c, lp in zip(expected, trained):
            assert torch.equal(c.logprobs, lp), c.request_id
        for batch in (5, 23):  # 5: buckets 1..4 pad; 23: one bucket of 23
            scheduler = Scheduler(model, max_batch_size=batch, eos_id=None, cuda_graphs="on")
            got = scheduler.generate(requests)
            assert scheduler.decoder is not None and scheduler.decoder.captures == 1
            for a, b in zip(expected, got):
                assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs), a.request_id


def test_moe_decode_in_graphs_runs_in_default_mode():
    model, _ = _moe_layer("tiny_moe")
    requests = _requests(9, vocab=model.cfg.vocab_size)
    with invariance.enabled(set()), torch.no_grad():
        scheduler = Scheduler(model, max_batch_size=8, eos_id=None, cuda_graphs="on")
        done = scheduler.generate(requests)
    assert scheduler.decoder.captures == 1
    assert all(len(c.tokens) == r.params.max_new_tokens for c, r in zip(done, requests))

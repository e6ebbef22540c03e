"""Decode in batch-size buckets (the CUDA-graph path), checked on the CPU without capture.

The padding of a bucket is the part of the graph path that could change a result, so it is
run here eagerly, exactly as the graphs run it: the real rows must be bitwise the same with
and without padding rows (fixes on), and the padding slots' own state must not move.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_cfg, small_model
from zkl import invariance
from zkl.generation.config import graph_setting
from zkl.generation.decode import Sampler, decode_one_token
from zkl.generation.graphs import (
    BucketedDecode,
    bucket_for,
    buckets_for,
    graph_unsupported_reason,
    padded_rows,
)
from zkl.generation.prefill import Admitted, prefill
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.models.build import build_model
from zkl.precision.recipes import apply_precision, quantizes

ALL = invariance.FIXES


def _model(moe: bool = False):
    return small_model(moe, seed=5)


def _requests(n: int, seed: int = 0) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(2, 30, (1,), generator=g))
        prompt = torch.randint(2, 60, (length,), generator=g).tolist()
        max_new = int(torch.randint(1, 9, (1,), generator=g))  # ragged: the batch shrinks
        out.append(Request(i, prompt, SamplingParams(max_new_tokens=max_new, seed=7 * i)))
    return out


def test_buckets_and_padding_rows():
    assert buckets_for(64) == (1, 2, 4, 8, 16, 32, 64)
    assert buckets_for(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    assert buckets_for(1) == (1,)
    assert [bucket_for(n, buckets_for(100)) for n in (1, 3, 4, 33, 65, 100)] == [
        1,
        4,
        4,
        64,
        100,
        100,
    ]
    with pytest.raises(ValueError):
        bucket_for(101, buckets_for(100))
    assert padded_rows([5, 2, 7], [6, 0, 3, 1], 5) == [5, 2, 7, 0, 1]
    with pytest.raises(ValueError):
        padded_rows([5, 2, 7], [6], 5)
    assert [graph_setting(v) for v in ("auto", "on", "off", True, False, "True")] == [
        "auto",
        "on",
        "off",
        "on",
        "off",
        "on",
    ]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_padding_rows_leave_real_rows_bitwise_unchanged(moe):
    """Whole runs: eager decode of the running rows vs the bucketed decode with padding
    (MoE too: padding rows route to experts and change every group's size)."""
    model = _model(moe)
    requests = _requests(11)
    with invariance.enabled(ALL):
        plain = Scheduler(model, max_batch_size=6, eos_id=1, cuda_graphs="off")
        expected = plain.generate(requests)
        padded = Scheduler(model, max_batch_size=6, eos_id=1, cuda_graphs="off")
        padded.decoder = BucketedDecode(6, capture=False)
        got = padded.generate(requests)
        again = padded.generate(list(reversed(requests)))  # the static buffers, reused
    assert padded.decoder.padding_rows > 0  # buckets 1, 2, 4, 6 padded some steps
    assert padded.stats.decode_steps > 0
    for a, b in zip(expected, got):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)
    for a, b in zip(expected, sorted(again, key=lambda c: c.request_id)):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)


def test_one_padded_step_changes_no_real_row_and_no_padding_state():
    """One decode step: real rows [3, 0] alone vs with free slots 1, 2 as padding."""
    model = _model()
    scheduler = Scheduler(model, max_batch_size=4, eos_id=None, cuda_graphs="off")
    requests = [Request(i, list(range(2, 9 + 3 * i)), SamplingParams(seed=i)) for i in range(4)]
    with invariance.enabled(ALL), torch.no_grad():
        sampler = Sampler(top_k=False, top_p=False, eos_id=None)
        cache, state = scheduler.new_buffers(40, 8)
        admitted = [Admitted(slot, r.prompt, r.params) for slot, r in enumerate(requests)]
        prefill(model, cache, state, admitted, sampler, None, 0, 0)
        state.done[1:3] = True  # slots 1 and 2 are free: the padding
        snapshots = []
        for rows in ([3, 0], [3, 0, 1, 2]):
            c = type(cache).__new__(type(cache))
            c.k, c.v, c.max_len = cache.k.clone(), cache.v.clone(), cache.max_len
            s = type(state).__new__(type(state))
            s.__dict__ = {k: v.clone() for k, v in state.__dict__.items()}
            decode_one_token(model, c, s, torch.tensor(rows), sampler)
            snapshots.append((c, s))
    (c1, s1), (c2, s2) = snapshots
    for slot in (3, 0):
        assert torch.equal(c1.k[:, slot], c2.k[:, slot])
        assert torch.equal(c1.v[:, slot], c2.v[:, slot])
    for name, value in s1.__dict__.items():
        assert torch.equal(value[[3, 0]], getattr(s2, name)[[3, 0]]), name
        assert torch.equal(value[[1, 2]], getattr(state, name)[[1, 2]]), name  # untouched
        assert torch.equal(getattr(s2, name)[[1, 2]], getattr(state, name)[[1, 2]]), name
    assert not torch.equal(s1.count, state.count)  # the step did run


def test_graph_setting_is_checked_and_explained():
    dense, moe = _model(), _model(moe=True)
    cpu = torch.device("cpu")
    assert "CUDA device" in graph_unsupported_reason(dense.cfg, cpu)
    assert "CUDA device" in graph_unsupported_reason(moe.cfg, cpu)  # its decode reads nothing back
    quantized = _model(moe=True)
    apply_precision(quantized, torch.bfloat16, "mxfp8")  # one call per expert
    assert quantizes(quantized) and not quantizes(moe)
    assert "MoE" in graph_unsupported_reason(quantized.cfg, cpu, quantizes(quantized))
    hybrid = build_model(make_cfg("model=tiny_hybrid").model, torch.bfloat16, seed=1)
    assert "CUDA device" in graph_unsupported_reason(hybrid.cfg, cpu)  # Mamba commits on device
    megatron_moe = graph_unsupported_reason(moe.cfg, cpu, engine="megatron_local")
    assert "MoE layers of engine.name=megatron_local" in megatron_moe  # its dispatcher reads sizes
    assert "CUDA device" in graph_unsupported_reason(dense.cfg, cpu, engine="megatron_local")
    with pytest.raises(ValueError, match="scheduler.cuda_graphs=on"):
        Scheduler(dense, max_batch_size=2, eos_id=None, cuda_graphs="on")
    with pytest.raises(ValueError, match="scheduler.cuda_graphs"):
        Scheduler(dense, max_batch_size=2, eos_id=None, cuda_graphs="sometimes")
    for model in (dense, moe):  # auto on the CPU: no graphs, no error
        assert Scheduler(model, max_batch_size=2, eos_id=None).decoder is None


def test_static_shapes_attention_masks_the_whole_cache_and_reads_nothing_back(monkeypatch):
    """The default path's decode attention under `static_shapes` (graph warm-up and capture
    alike) spans the whole cache with a mask: no `.item()`, and the same result as slicing
    the keys up to the last position (default mode: within float rounding, atol 1e-6)."""
    from zkl.ops import fast

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 16, generator=g)
    k, v = (torch.randn(5, 2, 40, 16, generator=g) for _ in range(2))
    q_pos = torch.tensor([[7], [19], [3]])
    rows = torch.tensor([4, 0, 2])
    sliced = fast.attention(q, k, v, q_pos, rows)

    def no_host_reads(self):
        raise AssertionError("read a device value back to the host")

    with fast.static_shapes(), monkeypatch.context() as m:
        m.setattr(torch.Tensor, "item", no_host_reads)
        whole = fast.attention(q, k, v, q_pos, rows)
    torch.testing.assert_close(whole, sliced, atol=1e-6, rtol=0)

"""CUDA-graph decode on the GPU: graphs on == graphs off bit for bit with the fixes on, across
schedules, refits (weights copied in place, graphs kept) and MXFP8 (graphs recaptured after a
refit re-quantizes). Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_cfg
from zkl import invariance
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.layouts.refit import load_refit
from zkl.models.build import build_model
from zkl.trainer.scoring import score

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _requests(n: int, seed: int = 0, top_k: int = 0) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(2, 60, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g)
        max_new = int(torch.randint(2, 12, (1,), generator=g))
        params = SamplingParams(max_new_tokens=max_new, seed=i, top_k=top_k)
        out.append(Request(i, prompt.tolist(), params))
    return out


def _model(name: str = "tiny_dense", quant: str = "none", seed: int = 1):
    return build_model(make_cfg(f"model={name}").model, torch.bfloat16, quant, seed, DEV)


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.tokens == y.tokens and torch.equal(x.logprobs, y.logprobs), x.request_id


@pytest.mark.parametrize(
    "name,top_k", [("tiny_dense", 0), ("tiny_dense", 5), ("tiny_moe", 0), ("tiny_hybrid", 0)]
)
def test_graphs_equal_eager_and_scoring_any_schedule(name, top_k):
    """Dense, MoE (grouped experts on the device) and hybrid (the Mamba chunk commit on the
    device): decode replayed from graphs == eager == scoring, bit for bit, with padding."""
    model = _model(name)
    requests = _requests(23, top_k=top_k)
    with invariance.enabled(invariance.FIXES):
        eager = Scheduler(model, max_batch_size=1, eos_id=1, cuda_graphs="off")
        expected = eager.generate(requests)
        lp_train = score(model, [c.prompt for c in expected], [c.tokens for c in expected])
        for c, lp in zip(expected, lp_train):
            assert torch.equal(c.logprobs, lp)
        padding = 0
        for batch, chunk, sync in ((1, 0, 1), (5, 7, 3), (16, 0, 8), (23, 16, 4)):
            scheduler = Scheduler(
                model,
                max_batch_size=batch,
                eos_id=1,
                prefill_chunk=chunk,
                sync_every=sync,
                cuda_graphs="on",
            )
            _same(expected, scheduler.generate(requests))
            _same(expected, scheduler.generate(requests))  # replayed, not recaptured
            assert scheduler.decoder.captures == 1
            padding += scheduler.decoder.padding_rows
        # whether a schedule pads depends on when rows finish (batch 5 may never); some must
        assert padding > 0


@pytest.mark.parametrize("quant", ["none", "mxfp8"])
def test_refit_in_place_keeps_graphs_exact(quant):
    model = _model(quant=quant)
    new_weights = {n: p.detach().clone() for n, p in _model(quant=quant, seed=2).named_parameters()}
    requests = _requests(9, seed=3)
    with invariance.enabled(invariance.FIXES):
        scheduler = Scheduler(model, max_batch_size=8, eos_id=1, cuda_graphs="on")
        before = scheduler.generate(requests)
        load_refit(model, new_weights)
        scheduler.on_refit(1)
        after = scheduler.generate(requests)
        # mxfp8: the refit re-quantizes, so the graphs were dropped and captured again
        assert scheduler.decoder.captures == (2 if quant == "mxfp8" else 1)
        eager = Scheduler(model, max_batch_size=8, eos_id=1, cuda_graphs="off")
        _same(eager.generate(requests), after)
        lp_train = score(model, [c.prompt for c in after], [c.tokens for c in after])
    assert any(a.tokens != b.tokens for a, b in zip(before, after))  # the refit mattered
    for c, lp in zip(after, lp_train):
        assert torch.equal(c.logprobs, lp)


def test_default_mode_graphs_capture_and_generate():
    """Fixes off (cuBLAS, SDPA): the graphs capture and produce every token; no bitwise claim."""
    model = _model()
    requests = _requests(12, seed=4)
    with invariance.enabled(()):
        scheduler = Scheduler(model, max_batch_size=8, eos_id=None, cuda_graphs="on")
        done = scheduler.generate(requests)
    assert scheduler.decoder.captures == 1
    for r, c in zip(requests, done):
        assert len(c.tokens) == r.params.max_new_tokens
        assert torch.isfinite(c.logprobs).all() and (c.logprobs <= 0).all()


def test_graphs_refused_or_skipped_where_decode_syncs():
    """Where decode reads back to the host (MoE under a quantizing recipe), `on` is refused
    and `auto` decodes eagerly; bf16 MoE and hybrid decode on the device and are captured."""
    auto = {"max_batch_size": 4, "eos_id": 1, "cuda_graphs": "auto"}
    for syncs in (_model("tiny_moe", quant="mxfp8"), _model("tiny_hybrid", quant="mxfp8")):
        with pytest.raises(ValueError, match="scheduler.cuda_graphs=on"):
            Scheduler(syncs, max_batch_size=4, eos_id=1, cuda_graphs="on")
        assert Scheduler(syncs, **auto).decoder is None  # auto: eager where decode syncs
    for name in ("tiny_dense", "tiny_moe", "tiny_hybrid"):
        assert Scheduler(_model(name), **auto).decoder is not None, name

"""The scheduler: continuous batching, sampling, prefix cache, the logprob path."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import small_model
from zkl import invariance
from zkl.generation.sampling import SamplingParams, processed_logits, sample
from zkl.generation.scheduler import Request, Scheduler
from zkl.trainer.scoring import score

ALL = invariance.FIXES


def _model(moe: bool = False):
    return small_model(moe, seed=3)


def _requests(n: int, seed: int = 0, max_new: int = 7, temperature: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    prefix = list(range(2, 36))  # a shared "system prompt" of 34 tokens
    out = []
    for i in range(n):
        tail = torch.randint(2, 60, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g)
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new, seed=100 + i)
        out.append(Request(i, prefix + tail.tolist(), params))
    return out


def _generate(model, requests, **scheduler_kwargs):
    scheduler = Scheduler(model, eos_id=1, **{"max_batch_size": 4, **scheduler_kwargs})
    return scheduler, scheduler.generate(requests)


def test_batch_one_equals_batch_n_and_scoring():
    model = _model()
    requests = _requests(9)
    with invariance.enabled(ALL):
        _, one = _generate(model, requests, max_batch_size=1)
        _, many = _generate(model, list(reversed(requests)), max_batch_size=4, prefill_chunk=5)
        many = sorted(many, key=lambda c: c.request_id)
        lp_train = score(model, [c.prompt for c in one], [c.tokens for c in one])
    for a, b, t in zip(one, many, lp_train):
        assert a.tokens == b.tokens
        assert torch.equal(a.logprobs, b.logprobs)
        assert torch.equal(a.logprobs, t)


def test_continuous_batching_changes_composition():
    model = _model()
    requests = _requests(6)
    requests[0] = Request(0, requests[0].prompt, SamplingParams(max_new_tokens=2, seed=1))
    with invariance.enabled(ALL):
        scheduler, done = _generate(model, requests, max_batch_size=3)
    assert [c.request_id for c in done] == list(range(6))
    assert len(done[0].tokens) <= 2
    total = sum(len(c.tokens) for c in done)
    # every decode step served several requests, and fewer steps than tokens were needed
    assert scheduler.stats.decode_steps < total
    assert all(c.finish_reason in ("eos", "length") for c in done)


def test_samples_do_not_depend_on_neighbours_in_default_mode_too():
    """Sampling draws from the request's own generator (logits may still differ)."""
    model = _model()
    requests = _requests(3)
    with invariance.enabled(ALL):
        _, alone = _generate(model, requests[:1], max_batch_size=1)
        _, together = _generate(model, requests, max_batch_size=3)
    assert alone[0].tokens == together[0].tokens


def test_prefix_cache_hits_and_changes_nothing():
    model = _model(moe=True)
    requests = _requests(8)
    with invariance.enabled(ALL):
        scheduler, persist = _generate(model, requests, kv_mode="persist")
        _, recompute = _generate(model, requests, kv_mode="recompute")
    # the first 4 are prefilled together (nothing cached yet); the 4 admitted later each hit
    # the two full 16-token blocks of the shared prefix
    assert scheduler.stats.prefix_hit_tokens == 4 * 32
    for a, b in zip(persist, recompute):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)


def test_a_prefix_hit_beside_a_longer_prompt_stays_inside_the_cache():
    """A prefill batch of a prefix hit (a 1-token remainder from position 32) and a fresh
    prompt of 35 pads the hit's row up to position 66, past the 39 positions the cache
    holds: the pads stay inside it, and the results are recompute mode's."""
    model = _model()
    g = torch.Generator().manual_seed(3)
    shared, other = (torch.randint(2, 60, (n,), generator=g).tolist() for n in (33, 35))
    requests = [
        Request(i, p, SamplingParams(max_new_tokens=4, seed=i))
        for i, p in enumerate([shared, shared, other])
    ]
    with invariance.enabled(ALL):
        scheduler = Scheduler(model, eos_id=None, max_batch_size=3, kv_mode="persist")
        scheduler.generate(requests[:1])
        persist = scheduler.generate(requests[1:])
        assert scheduler.stats.prefix_hit_tokens == 32 and scheduler.stats.ragged_prefills == 1
        fresh = Scheduler(model, eos_id=None, max_batch_size=3, kv_mode="recompute")
        recompute = fresh.generate(requests[1:])
    for a, b in zip(persist, recompute):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)


def test_logprob_path_fix():
    """Off: logits / T in the model dtype; on: the trainer's fp32 raw log-softmax."""
    model = _model()
    requests = _requests(6, temperature=0.7)
    diffs = {}
    for on in (False, True):
        fixes = set(ALL) - (set() if on else {"logprob_path"})
        with invariance.enabled(fixes):
            _, done = _generate(model, requests)
            temps = [r.params.temperature for r in requests]
            lp_train = score(model, [c.prompt for c in done], [c.tokens for c in done], temps)
        gen = torch.cat([c.logprobs for c in done])
        diffs[on] = (gen - torch.cat(lp_train)).abs().max().item()
    assert diffs[False] > 0
    assert diffs[True] == 0.0


def test_top_k_top_p_processing():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 3)
    one = torch.ones(3)
    out = processed_logits(logits, one, top_k=torch.tensor([2, 0, 3]))
    assert torch.isinf(out[0, 2:]).all() and torch.isfinite(out[0, :2]).all()
    assert torch.isfinite(out[1]).all() and torch.isinf(out[2, 3])  # per-row k; 0 is off
    probs = torch.softmax(logits[0], -1)  # [0.644, 0.237, 0.087, 0.032]
    out = processed_logits(logits, one, top_p=torch.tensor([0.8, 1.0, 0.5]))
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()
    assert probs[0] < 0.8 < probs[:2].sum()
    assert torch.isfinite(out[1]).all() and torch.isinf(out[2, 1:]).all()
    out = processed_logits(logits, torch.full((3,), 0.5))
    assert torch.equal(out, logits / 0.5)


def test_sampler_is_keyed_by_seed_and_token_index_only():
    """A row's draw is a function of (seed, token index, its logits): never of its batch."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 50, generator=g)
    seeds, counters = torch.arange(32) * 31, torch.arange(32) % 4
    temps = torch.ones(32)
    full = sample(logits, seeds, counters, temps)
    for lo, hi in ((0, 1), (3, 9), (20, 32)):
        assert torch.equal(
            sample(logits[lo:hi], seeds[lo:hi], counters[lo:hi], temps[lo:hi]), full[lo:hi]
        )
    assert not torch.equal(sample(logits, seeds, counters + 1, temps), full)


def test_sampler_follows_the_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).expand(40_000, 4)
    tokens = sample(
        logits, torch.arange(40_000), torch.zeros(40_000, dtype=torch.long), torch.ones(40_000)
    )
    freq = torch.bincount(tokens, minlength=4) / 40_000
    torch.testing.assert_close(freq, torch.softmax(logits[0], -1), atol=0.01, rtol=0)


def test_positions_past_the_rotary_tables_are_refused_before_any_kernel():
    """The fused RoPE reads its tables without a bounds check, so the scheduler and the train
    path refuse what would need a position past them, naming the key."""
    model = small_model()
    limit = model.cfg.max_position_embeddings
    scheduler = Scheduler(model, max_batch_size=2, eos_id=None)
    request = Request(0, [1] * (limit - 3), SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="model.max_position_embeddings"):
        scheduler.generate([request])
    tokens = torch.ones(1, limit + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="model.max_position_embeddings"):
        model(tokens, torch.arange(limit + 1).unsqueeze(0))

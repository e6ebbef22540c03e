"""Property: over random batch compositions and prompt lengths, zero mode is bitwise equal."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zkl import invariance
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.models.build import build_model
from zkl.models.config import ModelConfig
from zkl.trainer.scoring import score

pytestmark = pytest.mark.slow  # a minute of random schedules; `pytest -m "not slow"` skips it

MODEL = build_model(ModelConfig(), torch.bfloat16, seed=11)

compositions = st.fixed_dictionaries(
    {
        "lengths": st.lists(st.integers(1, 40), min_size=1, max_size=8),
        "batch": st.integers(1, 6),
        "chunk": st.sampled_from([0, 3, 16]),
        "micro": st.integers(0, 4),
        "shared_prefix": st.booleans(),
        "seed": st.integers(0, 10_000),
    }
)


def _mismatch(fixes, comp) -> float:
    g = torch.Generator().manual_seed(comp["seed"])
    prefix = torch.randint(2, 60, (20,), generator=g).tolist() if comp["shared_prefix"] else []
    requests = [
        Request(
            i,
            prefix + torch.randint(2, 60, (n,), generator=g).tolist(),
            SamplingParams(max_new_tokens=5, seed=comp["seed"] + i),
        )
        for i, n in enumerate(comp["lengths"])
    ]
    with invariance.enabled(fixes):
        scheduler = Scheduler(
            MODEL, max_batch_size=comp["batch"], eos_id=1, prefill_chunk=comp["chunk"]
        )
        done = scheduler.generate(requests)
        lp_train = score(
            MODEL, [c.prompt for c in done], [c.tokens for c in done], None, comp["micro"]
        )
    gen = torch.cat([c.logprobs for c in done])
    return (gen - torch.cat(lp_train)).abs().max().item()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(compositions)
def test_zero_mode_is_bitwise_equal(comp):
    assert _mismatch(invariance.FIXES, comp) == 0.0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(compositions)
def test_default_mode_is_not(comp):
    assert _mismatch(set(), comp) > 0.0

"""The behaviour distribution under top-k / top-p: the generator reports `lp_sampled`, the
logprob under the filtered, renormalised distribution each token was drawn from, beside the
raw `lp_gen`; recomputed here independently from the model's logits."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import SMALL, make_cfg, small_model
from zkl import invariance
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.rl.loop import run

ALL = invariance.FIXES


def _requests(top_k: int, top_p: float, n: int = 6) -> list[Request]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        prompt = torch.randint(2, 60, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)
        params = SamplingParams(0.9, top_p, top_k, max_new_tokens=6, seed=7 + i)
        out.append(Request(i, prompt.tolist(), params))
    return out


def _generate(model, requests, fixes=ALL):
    with invariance.enabled(fixes):
        scheduler = Scheduler(model, max_batch_size=4, eos_id=1)
        return scheduler.generate(requests)


def filtered_logprob(
    logits: torch.Tensor, token: int, temp: float, k: int, p: float
) -> tuple[float, float]:
    """(log q(token), log of the mass kept): q is softmax(logits / T) cut to the top k (ties
    with the k-th kept: bf16 logits tie often), then to the fewest tokens whose probability
    reaches p (the one crossing it kept), renormalised; float64, written here from the
    definition, not the sampler's code."""
    probs = torch.softmax(logits.double() / temp, dim=-1)
    order = sorted(range(len(probs)), key=lambda v: (-probs[v].item(), v))
    if k > 0:
        kth = probs[order[k - 1]]
        order = [v for v in order if probs[v] >= kth]
    kept, mass = [], 0.0
    restricted = probs[order] / probs[order].sum()
    for v, q in zip(order, restricted.tolist()):
        if p < 1 and mass >= p:
            break
        kept.append(v)
        mass += q
    assert token in kept, "a sampled token outside the filtered support"
    mass = probs[kept].sum()
    return (probs[token] / mass).log().item(), mass.log().item()


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.7), (8, 0.8)])
@pytest.mark.parametrize("fixes", [ALL, frozenset()], ids=["zero", "default"])
def test_lp_sampled_is_the_filtered_logprob_and_never_below_the_raw_one(fixes, top_k, top_p):
    """Both modes: lp_sampled is the raw lp_gen less the log of the mass the filter kept, so
    never below it and above it where the filter cut. Zero mode's decode logits are the
    scorer's, so its lp_sampled is checked against the filtered logprob of the definition;
    default mode's are not (its kernels move a near tie across the top-k edge), so there the
    bound is the check."""
    model = small_model()
    done = _generate(model, _requests(top_k, top_p), fixes)
    raised = 0
    for c in done:
        assert c.lp_sampled.dtype == torch.float32 and c.lp_sampled.shape == c.logprobs.shape
        assert bool((c.lp_sampled >= c.logprobs).all())
        raised += int((c.lp_sampled > c.logprobs).sum())
        if fixes != ALL:
            continue
        tokens = torch.tensor([c.prompt + c.tokens])
        positions = torch.arange(tokens.shape[1]).unsqueeze(0)
        with invariance.enabled(ALL), torch.no_grad():
            logits = model(tokens, positions)[0]  # [T, V]
        for j, token in enumerate(c.tokens):
            want, kept = filtered_logprob(logits[len(c.prompt) - 1 + j], token, 0.9, top_k, top_p)
            assert c.lp_sampled[j].item() == pytest.approx(want, abs=2e-4)
            assert (c.lp_sampled[j] - c.logprobs[j]).item() == pytest.approx(-kept, abs=2e-4)
    assert raised > 0  # the filter did cut mass somewhere


@pytest.mark.parametrize("fixes", [ALL, frozenset()], ids=["zero", "default"])
def test_without_a_filter_lp_sampled_is_bitwise_lp_gen(fixes):
    done = _generate(small_model(), _requests(0, 1.0), fixes)
    assert all(torch.equal(c.lp_sampled, c.logprobs) for c in done)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
def test_token_records_carry_both_and_gen_kl_compares_raw(layout, tmp_path):
    """Both layouts (the dedicated generator sends its completions to the trainer): the
    records hold lp_gen and lp_sampled; zero mode stays exactly zero (raw against raw) while
    behavior=sampled moves the correction's ratio off 1."""
    cfg = make_cfg(f"+layout={layout}", "sampling.top_k=6", "rl.steps=1", "rl.correction.mode="
                   "token_tis", "rl.correction.behavior=sampled", "tracking.dump_tokens=all",
                   *SMALL)  # fmt: skip
    (row,) = run(cfg, tmp_path)
    assert row["train/gen_kl_error"] == 0.0 and row["train/max_abs_logprob_diff"] == 0.0
    assert row["rollout_corr/ratio_min"] < 1.0  # lp_train / lp_sampled: the raw is smaller
    import json

    records = [json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    assert records and all(len(r["lp_sampled"]) == len(r["lp_gen"]) for r in records)
    assert all(s >= g for r in records for s, g in zip(r["lp_sampled"], r["lp_gen"]))
    assert any(s > g for r in records for s, g in zip(r["lp_sampled"], r["lp_gen"]))

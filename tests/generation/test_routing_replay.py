"""Routing replay (R3): the generator records each position's experts compactly; the
trainer's scoring and update use them. Zero mode: bitwise unchanged with replay on (the
routes are the generator's anyway); forged routes: the replay really steers the experts."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import make_cfg, small_model
from zkl import invariance
from zkl.errors import ConfigError
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.rl.loss import grpo_loss
from zkl.routes import RouteTape, replay_batch, routing_metrics
from zkl.run.validate import validate
from zkl.trainer.batch import UpdateBatch
from zkl.trainer.build import build_policy
from zkl.trainer.scoring import score

ALL = invariance.FIXES


def _requests(n: int = 5) -> list[Request]:
    g = torch.Generator().manual_seed(2)
    out = []
    for i in range(n):
        prompt = torch.randint(2, 60, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g)
        out.append(Request(i, prompt.tolist(), SamplingParams(max_new_tokens=5, seed=30 + i)))
    return out


def _generate(model, fixes=ALL, **kwargs):
    with invariance.enabled(fixes):
        scheduler = Scheduler(
            model, eos_id=1, record_routes=True, **{"max_batch_size": 4, **kwargs}
        )
        return scheduler.generate(_requests())


def test_routes_are_recorded_compactly_for_every_input_position():
    model = small_model(moe=True)
    done = _generate(model, max_batch_size=2, prefill_chunk=3)
    layers, k = model.cfg.num_hidden_layers, model.cfg.moe.num_experts_per_tok
    for c in done:
        assert c.routes.dtype == torch.int8
        assert c.routes.shape == (len(c.prompt) + len(c.tokens), layers, k)
        assert bool((c.routes[:-1] >= 0).all()) and bool((c.routes[-1] == -1).all())
        assert bool((c.routes[:-1] < model.cfg.moe.num_experts).all())
    # the same routes whatever the schedule (zero mode: a route is a function of the prefix)
    again = _generate(model, max_batch_size=5)
    assert all(torch.equal(a.routes, b.routes) for a, b in zip(done, again))
    # and they are the trainer's own choices: a compare-only tape finds no difference
    prompts, responses = [c.prompt for c in done], [c.tokens for c in done]
    counts = torch.zeros(4, dtype=torch.float64)
    with invariance.enabled(ALL):
        score(
            model,
            prompts,
            responses,
            routes=[c.routes for c in done],
            replay=False,
            route_counts=counts,
        )
    assert counts[0] == sum(len(c.prompt) + len(c.tokens) - 1 for c in done) * layers
    assert routing_metrics(counts) == {
        "routing/decision_mismatch_frac": 0.0,
        "routing/token_mismatch_frac": 0.0,
    }


@pytest.mark.slow  # two policies and a scheduler: tens of seconds on two busy cores
def test_zero_mode_scoring_and_one_minibatch_update_are_bitwise_unchanged():
    cfg = make_cfg("model=tiny_moe", "rl.routing_replay=true", "rl.num_minibatches=1")
    with invariance.enabled(invariance.from_config(cfg)):
        plain = build_policy(cfg, grpo_loss(cfg.rl))
        replayed = build_policy(cfg, grpo_loss(cfg.rl))
        done = _generate(replayed.model)
        prompts, responses = [c.prompt for c in done], [c.tokens for c in done]
        routes = [c.routes for c in done]
        temps = [1.0] * len(done)
        lp_plain, none = plain.score(prompts, responses, temps)
        lp_replay, routing = replayed.score(prompts, responses, temps, routes, replay=True)
        assert none == {} and set(routing.values()) == {0.0}
        assert all(torch.equal(a, b) for a, b in zip(lp_plain, lp_replay))
        assert all(torch.equal(a, c.logprobs) for a, c in zip(lp_plain, done))
        adv = torch.linspace(-1, 1, len(done))
        plain.update(UpdateBatch(prompts, responses, lp_plain, adv, temps))
        replayed.update(UpdateBatch(prompts, responses, lp_replay, adv, temps, routes=routes))
        a, b = plain.refit_state(), replayed.refit_state()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_forged_routes_steer_the_experts_and_the_gate_stays_differentiable():
    """The contrast: routes other than the router's change the logprobs, and the update's
    gradient still reaches the router (its probabilities weight the replayed experts)."""
    model = small_model(moe=True)
    done = _generate(model)
    prompts, responses = [c.prompt for c in done], [c.tokens for c in done]
    forged = []
    for c in done:
        r = c.routes.clone()
        known = r >= 0
        r[known] = (r[known] + 1) % model.cfg.moe.num_experts  # every choice moved one expert on
        forged.append(r)
    counts = torch.zeros(4, dtype=torch.float64)
    with invariance.enabled(ALL):
        own = score(model, prompts, responses)
        moved = score(model, prompts, responses, routes=forged, route_counts=counts)
        assert routing_metrics(counts)["routing/token_mismatch_frac"] == 1.0  # layer 0's
        counts.zero_()
        compared = score(
            model, prompts, responses, routes=forged, replay=False, route_counts=counts
        )
        assert all(torch.equal(a, b) for a, b in zip(own, compared))  # compared, not used
        assert set(routing_metrics(counts).values()) == {1.0}
        assert not all(torch.equal(a, b) for a, b in zip(own, moved))
        from zkl.trainer.batch import pad_sequences
        from zkl.trainer.scoring import sequence_logprobs

        tokens, _ = pad_sequences(prompts, responses)
        trained = copy.deepcopy(model)
        tape = RouteTape(replay_batch(forged, tokens.shape[1]))
        sequence_logprobs(trained, tokens, routes=tape).sum().backward()
    gate = trained.layers[0].mlp.gate.weight.grad
    assert gate is not None and bool(gate.abs().sum() > 0)


def test_the_route_mismatch_is_counted_in_the_scoring_forward(tmp_path, monkeypatch):
    """rl.record_routes logs the routing/* shares from scoring's own forward: a step runs
    as many trainer forwards as one that records nothing."""
    from zkl.models.transformer import Transformer
    from zkl.rl.loop import run

    forwards = []
    hidden_states = Transformer.hidden_states
    monkeypatch.setattr(
        Transformer, "hidden_states", lambda *a, **k: forwards.append(1) or hidden_states(*a, **k)
    )
    common = ["model=tiny_moe", "rl.steps=1", "num_threads=1", "checkpoint.save=false"]
    (plain,) = run(make_cfg(*common), tmp_path / "plain")
    plain_forwards, forwards[:] = len(forwards), []
    (recorded,) = run(make_cfg(*common, "rl.record_routes=true"), tmp_path / "recorded")
    assert len(forwards) == plain_forwards
    assert (
        recorded["routing/decision_mismatch_frac"] == 0.0 == recorded["routing/token_mismatch_frac"]
    )
    assert "routing/token_mismatch_frac" not in plain


def test_replay_on_a_dense_model_stops_in_one_sentence():
    with pytest.raises(ConfigError, match=r"rl\.routing_replay=true .*dense"):
        validate(make_cfg("rl.routing_replay=true"))
    with pytest.raises(ConfigError, match=r"trainer\.world_size"):
        validate(make_cfg("model=tiny_moe", "rl.routing_replay=true", "trainer.world_size=2"))


def _token_records(run_dir) -> dict[int, list[dict]]:
    import json

    records: dict[int, list[dict]] = {}
    for line in (run_dir / "tokens.jsonl").read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["step"], []).append(record)
    return records


def test_replay_lowers_the_mismatch_of_one_rollout_and_sums_over_steps_compare_two_runs(
    tmp_path,
):
    """Issue 57 saw default mode's gen_kl_error summed over 3 tiny_moe steps higher with
    replay (1.363e-4) than without (1.319e-4). Only step 0 scores the same rollout in both
    arms: there replay moves the routed tokens' logprobs towards the generator's and cannot
    raise the mismatch; its update then trains on other logprobs, so from step 1 on each arm
    samples its own rollout from its own weights, and a sum over steps compares two runs."""
    from zkl.rl.loop import run

    common = ["model=tiny_moe", "zero_train_gen_mismatch=false", "rl.steps=3", "num_threads=1"]
    common += ["checkpoint.save=false", "tracking.dump_tokens=all"]
    plain = run(make_cfg(*common, "rl.record_routes=true"), tmp_path / "plain")
    replay = run(make_cfg(*common, "rl.routing_replay=true"), tmp_path / "replay")
    plain_tokens = _token_records(tmp_path / "plain")
    replay_tokens = _token_records(tmp_path / "replay")
    same = ("prompt", "response", "lp_gen")
    assert [[r[k] for k in same] for r in plain_tokens[0]] == [
        [r[k] for k in same] for r in replay_tokens[0]
    ]
    assert plain[0]["routing/token_mismatch_frac"] > 0  # some step-0 tokens routed otherwise
    assert replay[0]["train/gen_kl_error"] < plain[0]["train/gen_kl_error"]
    assert replay[0]["train/max_abs_logprob_diff"] <= plain[0]["train/max_abs_logprob_diff"]
    # the same sampling seeds, other weights: step 1's rollouts are no longer the same
    assert [r["lp_gen"] for r in plain_tokens[1]] != [r["lp_gen"] for r in replay_tokens[1]]

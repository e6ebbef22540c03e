"""The mismatch metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from zkl.rl.metrics import mismatch_metrics


def test_exact_match_gives_perfect_values():
    lp = torch.tensor([-0.1, -2.5, -7.0, -1e-6])
    m = mismatch_metrics(lp, lp.clone())
    assert m["train/gen_kl_error"] == 0.0
    assert m["train/policy_kl_error"] == 0.0
    assert m["train/js_divergence_error"] == 0.0
    assert m["train/token_mult_prob_error"] == 1.0
    assert m["train/sampling_importance_ratio"] == 1.0
    assert m["train/max_abs_logprob_diff"] == 0.0
    assert m["train/bitwise_equal_frac"] == 1.0


def test_hand_computed_values():
    lp_train = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    lp_gen = torch.tensor([-1.5, -2.0, -0.25], dtype=torch.float64)
    r = [0.5, 0.0, -0.25]  # lp_train - lp_gen

    def k3(x):
        return math.exp(x) - x - 1

    def js(a, b):
        mix = math.log(0.5 * math.exp(a) + 0.5 * math.exp(b))
        return 0.5 * k3(mix - a) + 0.5 * k3(mix - b)

    m = mismatch_metrics(lp_train, lp_gen)
    expected = {
        "train/gen_kl_error": sum(k3(x) for x in r) / 3,
        "train/policy_kl_error": sum(k3(-x) for x in r) / 3,
        "train/js_divergence_error": sum(
            js(a, b) for a, b in zip([-1, -2, -0.5], [-1.5, -2, -0.25])
        )
        / 3,
        "train/token_mult_prob_error": sum(math.exp(abs(x)) for x in r) / 3,
        "train/sampling_importance_ratio": sum(math.exp(x) for x in r) / 3,
        "train/max_abs_logprob_diff": 0.5,
        "train/bitwise_equal_frac": 1 / 3,
    }
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    # gen_kl_error (0.5 -> 0.14872..., -0.25 -> 0.02880...) written out once by hand:
    assert m["train/gen_kl_error"] == pytest.approx((0.1487212707 + 0.0288007831) / 3, rel=1e-9)


def test_shape_errors():
    with pytest.raises(ValueError):
        mismatch_metrics(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError):
        mismatch_metrics(torch.zeros(0), torch.zeros(0))

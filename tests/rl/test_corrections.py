"""Mismatch corrections (`rl.correction`): each mode against hand-computed weights, zero mode
bitwise equal to `mode=none`, the diagnostics' neutral values, and the refusals."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import make_cfg
from zkl.errors import ConfigError
from zkl.rl.config import CORRECTIONS, CorrectionConfig
from zkl.rl.correction import correction_weights, diagnostics, sequence_weights
from zkl.rl.loss import clipped_pg_loss
from zkl.run.validate import validate
from zkl.trainer.batch import spread

# two responses; log ratios lp_old - lp_beh chosen so each band cuts somewhere
LOG_RHO = [[0.0, math.log(3.0), math.log(0.25)], [math.log(1.5), math.log(1.2)]]
BEH = [torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-0.7, -1.1])]
OLD = [b + torch.tensor(r) for b, r in zip(BEH, LOG_RHO)]


def _rho(i: int) -> list[float]:
    """The ratios exactly as the code sees them (fp32 logprobs, their difference in fp64)."""
    return torch.exp(OLD[i].double() - BEH[i].double()).tolist()


def _hand(mode: str, cfg: CorrectionConfig) -> list[list[float]]:
    out = []
    for i in range(2):
        rho = _rho(i)
        seq = math.prod(rho)
        geo = seq ** (1 / len(rho))
        out.append(
            {
                "token_tis": [min(r, cfg.cap) for r in rho],
                "token_mis": [r if r <= cfg.cap else 0.0 for r in rho],
                "seq_tis": [min(seq, cfg.cap)] * len(rho),
                "seq_mis": [seq if seq <= cfg.cap else 0.0] * len(rho),
                "icepop": [r if cfg.low <= r <= cfg.high else 0.0 for r in rho],
                "geo_mis": [1.0 if cfg.low <= geo <= cfg.high else 0.0] * len(rho),
            }[mode]
        )
    return out


@pytest.mark.parametrize("mode", [m for m, weights in CORRECTIONS.items() if weights is not None])
def test_each_mode_matches_the_hand_computed_weights(mode):
    """Token and sequence level, both bands: rho = 1, 3, 1/4 and 1.5, 1.2 (products 3/4
    and 1.8); cap 2, band [0.5, 2.5] for icepop and [0.9, 1.5] for the geometric mean."""
    low, high = (0.9, 1.5) if mode == "geo_mis" else (0.5, 2.5)
    cfg = CorrectionConfig(mode=mode, cap=2.0, low=low, high=high)
    got = correction_weights(OLD, BEH, cfg)
    for w, want in zip(got, _hand(mode, cfg), strict=True):
        assert w.dtype == torch.float32
        assert w.tolist() == pytest.approx(want, rel=1e-6)
    # what each band cut, so no case passes vacuously
    cut = {"token_tis": None, "token_mis": [1], "seq_tis": None, "seq_mis": [], "icepop": [1, 2]}
    flat = torch.cat(got)
    if mode in ("token_mis", "icepop"):
        assert (flat == 0).nonzero().flatten().tolist() == cut[mode]
    if mode == "geo_mis":  # geometric means 0.909 (kept) and 1.342 (kept) -> narrow it
        narrow = correction_weights(OLD, BEH, CorrectionConfig(mode=mode, low=0.95, high=1.5))
        assert [w.tolist() for w in narrow] == [[0.0] * 3, [1.0] * 2]
    if mode == "seq_mis":  # 0.75 kept, 1.8 kept at cap 2; cap 1.5 drops the second
        tight = correction_weights(OLD, BEH, CorrectionConfig(mode=mode, cap=1.5))
        assert tight[1].tolist() == [0.0, 0.0] and tight[0].tolist() == pytest.approx([0.75] * 3)


def test_masked_tokens_of_a_padded_batch_get_no_weight():
    """Weights land at each response's places of the minibatch and nowhere else."""
    mask = torch.tensor([[False, True, True, True], [True, True, False, False]])
    w = correction_weights(OLD, BEH, CorrectionConfig(mode="token_tis"))
    laid = spread(w, mask)
    assert laid[~mask].eq(0).all()
    assert laid[mask].tolist() == torch.cat(w).tolist()


def _loss_and_grad(mode: str):
    torch.manual_seed(0)
    logits = torch.randn(2, 4, requires_grad=True)
    logp = torch.nn.functional.logsigmoid(logits)
    mask = torch.tensor([[False, True, True, True], [True, True, False, False]])
    old = logp.detach() + 0.05 * torch.randn(2, 4)
    lp_old = [old[i][mask[i]] for i in range(2)]  # zero mode: the generator's bits are these
    weights = correction_weights(lp_old, lp_old, CorrectionConfig(mode=mode))
    w = None if weights is None else spread(weights, mask)
    loss, _ = clipped_pg_loss(logp, old, torch.tensor([1.0, -0.5]), mask, 0.2, weights=w)
    loss.backward()
    return loss.detach(), logits.grad


@pytest.mark.parametrize("mode", list(CORRECTIONS))
def test_zero_mode_loss_and_gradient_are_bitwise_mode_none(mode):
    base_loss, base_grad = _loss_and_grad("none")
    loss, grad = _loss_and_grad(mode)
    assert torch.equal(loss, base_loss) and torch.equal(grad, base_grad)


def test_a_correction_changes_the_loss_when_the_ratios_differ():
    """The contrast: with a mismatch, token_tis weights the terms (loss != mode none)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    w = spread(correction_weights(OLD[:1], BEH[:1], CorrectionConfig(mode="token_tis")), mask)
    plain, _ = clipped_pg_loss(logp, OLD[0][None], torch.tensor([1.0]), mask, 0.2)
    fixed, _ = clipped_pg_loss(logp, OLD[0][None], torch.tensor([1.0]), mask, 0.2, weights=w)
    assert fixed.item() != plain.item()


NEUTRAL = {
    "kl": 0.0,
    "k3_kl": 0.0,
    "chi2_token": 0.0,
    "chi2_seq": 0.0,
    "eff_sample_size": 1.0,
    "log_ppl_abs_diff": 0.0,
    "ppl_ratio": 1.0,
    "masked_fraction": 0.0,
    "ratio_min": 1.0,
    "ratio_mean": 1.0,
    "ratio_max": 1.0,
}


@pytest.mark.parametrize("mode", list(CORRECTIONS))
def test_zero_mode_diagnostics_are_exactly_neutral(mode):
    weights = correction_weights(OLD, OLD, CorrectionConfig(mode=mode))
    got = diagnostics(OLD, OLD, weights)
    assert got == {f"rollout_corr/{k}": v for k, v in NEUTRAL.items()}


def test_diagnostics_move_off_neutral_with_a_mismatch():
    cfg = CorrectionConfig(mode="icepop", low=0.5, high=2.5)
    got = diagnostics(OLD, BEH, correction_weights(OLD, BEH, cfg))
    rho = torch.tensor(_rho(0) + _rho(1), dtype=torch.float64)
    assert got["rollout_corr/ratio_max"] == pytest.approx(3.0)
    assert got["rollout_corr/ratio_min"] == pytest.approx(0.25)
    assert got["rollout_corr/chi2_token"] == pytest.approx((rho.square().mean() - 1).item())
    assert got["rollout_corr/chi2_seq"] == pytest.approx((0.75**2 + 1.8**2) / 2 - 1, rel=1e-6)
    assert got["rollout_corr/masked_fraction"] == pytest.approx(2 / 5)
    ess = rho.mean().square() / rho.square().mean()
    assert got["rollout_corr/eff_sample_size"] == pytest.approx(ess.item())
    assert got["rollout_corr/k3_kl"] > 0 and got["rollout_corr/log_ppl_abs_diff"] > 0


def test_sequence_weights_of_an_empty_response_are_empty():
    empty = torch.zeros(0)
    for mode in [m for m, weights in CORRECTIONS.items() if weights is not None]:
        assert sequence_weights(empty, empty, CorrectionConfig(mode=mode)).numel() == 0


@pytest.mark.parametrize(
    "override, key",
    [
        ("rl.correction.mode=tis", "rl.correction.mode"),
        ("rl.correction.cap=0", "rl.correction.cap"),
        ("rl.correction.cap=-1", "rl.correction.cap"),
        ("rl.correction.low=6.0", "rl.correction.low"),
        ("rl.correction.behavior=filtered", "rl.correction.behavior"),
        ("rl.routing_replay=true", "rl.routing_replay"),
    ],
)
def test_bad_values_stop_before_any_work(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        validate(make_cfg(override))
    assert str(err.value).count(". ") <= 1  # one sentence

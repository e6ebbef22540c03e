"""Corrections for the train/generation mismatch (`rl.correction`), and their diagnostics.

The ratio of a response token is rho_t = exp(lp_old_t - lp_beh_t): the train path's logprob
of the rollout (the update's `old_logprobs`) over the generator's (`lp_gen`, or the
filtered distribution's `lp_sampled` with `rl.correction.behavior=sampled`). Each mode turns
the ratios of one response into a weight per token that multiplies that token's
policy-gradient term (no gradient flows through it). Formulas and sources:
docs/treatments.md. In zero mode every ratio is exactly 1, so every weight is exactly 1 and
the loss and its gradient are bitwise those of `mode=none` (x * 1.0 == x).
"""

from __future__ import annotations

import torch

from zkl.rl.config import CORRECTIONS

PREFIX = "rollout_corr/"


def sequence_weights(lp_old: torch.Tensor, lp_beh: torch.Tensor, cfg) -> torch.Tensor:
    """One response's per-token weights [T] (fp32) under `cfg` (`rl.correction`): its mode's
    rule in `zkl.rl.config.CORRECTIONS`, of the log ratios in float64."""
    weights = CORRECTIONS[cfg.mode]
    if weights is None:
        raise ValueError(f"rl.correction.mode={cfg.mode!r} has no weights")
    log_rho = lp_old.double() - lp_beh.double()  # [T]
    return weights(log_rho, cfg).float()


BEHAVIOR_FIELDS = {"raw": "logprobs", "sampled": "lp_sampled"}  # rl.correction.behavior


def behavior_logprobs(completions, behavior: str) -> list[torch.Tensor]:
    """The generator's logprob each ratio divides by: `raw` (what it reports, `lp_gen`) or
    `sampled` (of the filtered distribution the token was drawn from, `lp_sampled`)."""
    return [getattr(c, BEHAVIOR_FIELDS[behavior]) for c in completions]


def correction_weights(
    lp_old: list[torch.Tensor], lp_beh: list[torch.Tensor], cfg
) -> list[torch.Tensor] | None:
    """Every response's weights [T_i], or None for `mode=none` (the loss is left as it is)."""
    pairs = zip(lp_old, lp_beh, strict=True)
    if CORRECTIONS[cfg.mode] is None:
        return None
    return [sequence_weights(o, b, cfg) for o, b in pairs]


def diagnostics(
    lp_old: list[torch.Tensor],
    lp_beh: list[torch.Tensor],
    weights: list[torch.Tensor] | None,
) -> dict[str, float]:
    """The off-policy diagnostics of one step under `rollout_corr/`, verl's names.

    Token means are token-weighted over the step, sequence means over its responses; all in
    float64 from the fp32 logprobs, so in zero mode (every ratio exactly 1) each is exactly
    its neutral value: kl, k3_kl, chi2_token, chi2_seq, log_ppl_abs_diff, masked_fraction 0;
    ratio min/mean/max, ppl_ratio, eff_sample_size 1.
    """
    old = [o.double() for o in lp_old if o.numel()]
    beh = [b.double() for b in lp_beh if b.numel()]
    if not old:
        raise ValueError("no response tokens to diagnose")
    log_rho = torch.cat(old) - torch.cat(beh)  # [N]
    rho = torch.exp(log_rho)
    seq_log_rho = torch.stack([(o - b).sum() for o, b in zip(old, beh)])  # [S]
    log_ppl_old = torch.stack([-o.mean() for o in old])
    log_ppl_beh = torch.stack([-b.mean() for b in beh])
    if weights is None:
        masked = 0.0
    else:
        masked = (torch.cat([w for w in weights if w.numel()]) == 0).double().mean().item()
    return {
        f"{PREFIX}kl": (-log_rho).mean().item(),
        f"{PREFIX}k3_kl": (torch.expm1(log_rho) - log_rho).mean().item(),
        f"{PREFIX}chi2_token": (rho.square().mean() - 1).item(),
        f"{PREFIX}chi2_seq": (torch.exp(2 * seq_log_rho).mean() - 1).item(),
        f"{PREFIX}eff_sample_size": (rho.mean().square() / rho.square().mean()).item(),
        f"{PREFIX}log_ppl_abs_diff": (log_ppl_beh - log_ppl_old).abs().mean().item(),
        f"{PREFIX}ppl_ratio": torch.exp((log_ppl_old - log_ppl_beh).mean()).item(),
        f"{PREFIX}masked_fraction": masked,
        f"{PREFIX}ratio_min": rho.min().item(),
        f"{PREFIX}ratio_mean": rho.mean().item(),
        f"{PREFIX}ratio_max": rho.max().item(),
    }

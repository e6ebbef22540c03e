"""Train/generation mismatch metrics (docs/design.md section 2), with NeMo-RL's names.

Inputs are the per-token logprobs of the sampled response tokens: `lp_gen` from the
generation engine, `lp_train` from the train path; `r = lp_train - lp_gen`. Every mean is
token-weighted over the step. Computed in float64 from the fp32 logprobs, so an exact
match gives exactly the perfect value of every metric.
"""

from __future__ import annotations

import torch

PREFIX = "train/"


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL per token: exp(r) - r - 1 for log ratio r = log q - log p."""
    return torch.expm1(log_ratio) - log_ratio


def mismatch_metrics(lp_train: torch.Tensor, lp_gen: torch.Tensor) -> dict[str, float]:
    """All mismatch metrics over the flat token vectors lp_train, lp_gen [N] (response tokens)."""
    if lp_train.shape != lp_gen.shape or lp_train.dim() != 1:
        raise ValueError("lp_train and lp_gen must be flat vectors of the same length")
    if lp_train.numel() == 0:
        raise ValueError("no response tokens to compare")
    train, gen = lp_train.double(), lp_gen.double()
    r = train - gen
    high = torch.maximum(train, gen)  # log(0.5 e^a + 0.5 e^b), exact when a == b
    mix = high + torch.log(0.5 * torch.exp(train - high) + 0.5 * torch.exp(gen - high))
    js = 0.5 * _k3(mix - train) + 0.5 * _k3(mix - gen)
    return {
        f"{PREFIX}gen_kl_error": _k3(r).mean().item(),
        f"{PREFIX}policy_kl_error": _k3(-r).mean().item(),
        f"{PREFIX}js_divergence_error": js.mean().item(),
        f"{PREFIX}token_mult_prob_error": torch.exp(r.abs()).mean().item(),
        f"{PREFIX}sampling_importance_ratio": torch.exp(r).mean().item(),
        f"{PREFIX}max_abs_logprob_diff": r.abs().max().item(),
        f"{PREFIX}bitwise_equal_frac": (lp_train == lp_gen).double().mean().item(),
    }

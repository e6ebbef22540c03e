"""The metrics row of a step: the train/generation mismatch, the rollout, the clock.

Mismatch metrics (docs/design.md section 2) carry NeMo-RL's names. Their inputs are the
per-token logprobs of the sampled response tokens: `lp_gen` from the scheduler,
`lp_train` from the train path; `r = lp_train - lp_gen`. Every mean is token-weighted over
the step. Computed in float64 from the fp32 logprobs, so an exact match gives exactly the
perfect value of every metric. The corrections' diagnostics are zkl/rl/correction.py's, the
update's statistics the trainer's.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # annotations only
    from zkl.generation.scheduler import Completion, SchedulerStats

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


def rollout_metrics(
    completions: list[Completion],
    stats: SchedulerStats,
    rewards: torch.Tensor,
    advantages: torch.Tensor,
) -> dict[str, float]:
    """The rollout's rewards [N], the generator's schedule and the weights it sampled with."""
    num_tokens = sum(c.logprobs.numel() for c in completions)
    return {
        "reward/mean": rewards.mean().item(),
        "reward/exact_frac": (rewards == 1.0).float().mean().item(),
        "gen/response_len_mean": num_tokens / len(completions),
        "gen/response_tokens": num_tokens,
        "gen/decode_steps": stats.decode_steps,
        "gen/prefix_hit_tokens": stats.prefix_hit_tokens,
        "gen/ragged_prefills": stats.ragged_prefills,
        "gen/joined_running": stats.joined_running,
        "gen/weight_version": min(c.weight_version for c in completions),
        "rl/zero_adv_frac": (advantages == 0).float().mean().item(),
    }


def timing_metrics(marks: list[float], num_tokens: int, train_tokens: int) -> dict[str, float]:
    """Seconds of each part of a step from its five clock `marks` (before generation, after
    it, after scoring, after the update, after the refit) and the tokens per second of the
    generator (`num_tokens` sampled) and of scoring (`train_tokens`, prompts included)."""
    gen_s, score_s, update_s, refit_s = (b - a for a, b in pairwise(marks))
    return {
        "timing/gen_s": gen_s,
        "timing/score_s": score_s,
        "timing/update_s": update_s,
        "timing/refit_s": refit_s,
        "perf/gen_tokens_per_s": num_tokens / gen_s,
        "perf/train_tokens_per_s": train_tokens / score_s,
    }

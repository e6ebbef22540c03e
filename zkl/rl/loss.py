"""The GRPO update's loss: NeMo-RL's clipped policy-gradient surrogate, token-mean.

The trainer's update calls the loss it is given (`grpo_loss`), as torchtitan's trainer calls
its TrainSpec's `loss_fn`: the algorithm's math lives here, the optimizer steps there.
"""

from __future__ import annotations

import functools

import torch

from zkl.rl.config import RLConfig
from zkl.trainer.update import LossFn


def clipped_pg_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: int | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean clipped surrogate (as NeMo-RL's ClippedPGLossFn), all tensors [B, T].

    The importance ratio is against `old_logprobs`, the train-path logprobs of the rollout;
    `advantages` [B] broadcast over each sequence's tokens. Optional k3 KL penalty against
    `ref_logprobs`. `num_tokens`: the mean's denominator when these rows are one rank's
    share of a minibatch (the minibatch's token count; the ranks' losses then sum to it).
    `weights` [B, T]: the mismatch correction's per-token factors (zkl/rl/correction.py)
    on the policy-gradient term, detached; a dropped token keeps its place in the mean.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    per_token = -surrogate
    if weights is not None:
        per_token = per_token * weights.detach()
    if ref_logprobs is not None and kl_coef > 0:
        log_ratio = ref_logprobs - logprobs
        per_token = per_token + kl_coef * (torch.exp(log_ratio) - log_ratio - 1)
    num_tokens = mask.sum().clamp(min=1) if num_tokens is None else max(num_tokens, 1)
    loss = (per_token * mask).sum() / num_tokens
    clipped = ((ratio - 1).abs() > clip_eps) & mask
    return loss, {
        "loss/clip_frac": (clipped.sum() / num_tokens).item(),
        "loss/ratio_mean": ((ratio * mask).sum() / num_tokens).item(),
    }


def grpo_loss(rl: RLConfig) -> LossFn:
    """The loss the update minimizes: `clipped_pg_loss` with the run's `rl.clip_eps` and
    `rl.kl_coef`."""
    return functools.partial(clipped_pg_loss, clip_eps=rl.clip_eps, kl_coef=rl.kl_coef)

"""What the update is given and what it reports: the loss function the algorithm hands the
trainer (`LossFn`), and the statistics of its optimizer steps as the loop logs them. Its data,
the rollout and its minibatches, is in zkl/trainer/batch.py."""

from __future__ import annotations

from typing import Protocol

import torch


class LossFn(Protocol):
    """What the update minimizes, given by the algorithm (GRPO's: zkl/rl/loss.py `grpo_loss`).

    logprobs (differentiable), old_logprobs, mask and weights [B, T], advantages [B];
    `ref_logprobs` the reference model's (None without one), `num_tokens` the mean's
    denominator when the rows are one rank's share (None: their own), `weights` the
    correction's per-token factors (None: no correction). Returns the loss and the
    statistics it logs (floats, summed over the ranks).
    """

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        ref_logprobs: torch.Tensor | None,
        num_tokens: int | None,
        weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def update_stats(
    names: list[str], losses: list[list[float]], grad_norms: list[float], update_sq: float
) -> dict[str, float]:
    """The logged statistics of one update from each minibatch's [loss, *the loss's
    statistics `names`] (summed over the ranks), its gradient norm and the squared weight
    change. The loss's statistics are the last minibatch's, the loss the minibatches' mean.

    `optim/update_norm` is the L2 norm of the change of the weights the forward uses and the
    generator receives (bf16 ones under a bf16 recipe): zero when an update moved the fp32
    masters by less than the weights' precision.
    """
    return {
        **dict(zip(names, losses[-1][1:], strict=True)),
        "loss/pg_loss": sum(r[0] for r in losses) / len(losses),
        "optim/grad_norm": sum(grad_norms) / len(grad_norms),
        "optim/update_norm": update_sq**0.5,
    }

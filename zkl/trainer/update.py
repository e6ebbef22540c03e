"""The update's data: the rollout it learns from, cut into minibatches on the device, the
loss it is given, and the statistics of its optimizer steps as the loop logs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from zkl.trainer.scoring import pad_sequences


@dataclass
class UpdateBatch:
    prompts: list[list[int]]
    responses: list[list[int]]
    old_logprobs: list[torch.Tensor]  # train-path logprobs of each response
    advantages: torch.Tensor  # [N]
    temperatures: list[float]
    weights: list[torch.Tensor] | None = None  # the correction's per-token factors
    routes: list[torch.Tensor] | None = None  # the generator's experts [len, L, k] (replay)


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


def minibatch_edges(count: int, num_minibatches: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of `num_minibatches` near-equal contiguous minibatches of `count`."""
    edges = torch.linspace(0, count, num_minibatches + 1).long().tolist()
    return list(zip(edges[:-1], edges[1:]))


def minibatch(batch: UpdateBatch, lo: int, hi: int, device: torch.device):
    """(tokens, mask, old logprobs, temperatures, advantages) of sequences lo..hi, on `device`;
    tokens, mask and old logprobs [B, T], the rest [B]."""
    tokens, mask = pad_sequences(batch.prompts[lo:hi], batch.responses[lo:hi])
    mask = mask[:, :-1]
    old = spread(batch.old_logprobs[lo:hi], mask)
    tokens, mask, old = tokens.to(device), mask.to(device), old.to(device)
    temps = torch.tensor(batch.temperatures[lo:hi], device=device)
    return tokens, mask, old, temps, batch.advantages[lo:hi].to(device)


def spread(values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Each response's per-token values [T_i] at its mask's places of a zero [B, T] tensor."""
    out = torch.zeros(mask.shape)
    for i, v in enumerate(values):
        out[i][mask[i].cpu()] = v.cpu()
    return out


def minibatch_weights(batch: UpdateBatch, lo: int, hi: int, mask: torch.Tensor):
    """The correction's weights [B, T] of sequences lo..hi laid out as `mask`, or None."""
    if batch.weights is None:
        return None
    return spread(batch.weights[lo:hi], mask).to(mask.device)


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

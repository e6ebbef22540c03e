"""Sequences as the tensors a train-path forward reads: the padded tokens and response mask,
per-token values laid out on that mask, the generator's routes as a replay tape, and the
update's rollout cut into minibatches on the device. Scoring and the update both build their
batches here, so the two paths pad, mask and replay alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zkl.routes import RouteTape, replay_batch


def pad_sequences(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded tokens [B, T] of prompt+response and a mask [B, T] of response targets.

    mask[b, t] marks that position t predicts a response token (target tokens[b, t + 1]).
    """
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    tokens = torch.full((len(prompts), max(lengths)), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), max(lengths), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        tokens[i, : lengths[i]] = torch.tensor(p + r)
        mask[i, len(p) - 1 : lengths[i] - 1] = True
    return tokens, mask


def spread(values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Each response's per-token values [T_i] at its mask's places of a zero [B, T] tensor."""
    out = torch.zeros(mask.shape)
    for i, v in enumerate(values):
        out[i][mask[i].cpu()] = v.cpu()
    return out


def replay_tape(
    routes: list[torch.Tensor] | None, lo: int, hi: int, width: int, use: bool = True
) -> RouteTape | None:
    """The tape replaying sequences lo..hi's routes in a batch `width` wide (None: no
    routes); `use=False` only counts where the layers' own choices differ from them."""
    return None if routes is None else RouteTape(replay_batch(routes[lo:hi], width), use)


@dataclass
class UpdateBatch:
    """The rollout an update learns from, one entry per sequence."""

    prompts: list[list[int]]
    responses: list[list[int]]
    old_logprobs: list[torch.Tensor]  # train-path logprobs of each response
    advantages: torch.Tensor  # [N]
    temperatures: list[float]
    weights: list[torch.Tensor] | None = None  # the correction's per-token factors
    routes: list[torch.Tensor] | None = None  # the generator's experts [len, L, k] (replay)


@dataclass
class Minibatch:
    """Sequences lo..hi of an `UpdateBatch` on the device: tokens [B, T + 1]; mask, old
    logprobs and the correction's weights (None: no correction) [B, T]; temperatures and
    advantages [B]; the routes' replay tape (None: no replay)."""

    tokens: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    temperatures: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor | None
    routes: RouteTape | None


def minibatch_edges(count: int, num_minibatches: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of `num_minibatches` near-equal contiguous minibatches of `count`."""
    edges = torch.linspace(0, count, num_minibatches + 1).long().tolist()
    return list(zip(edges[:-1], edges[1:]))


def micro_batch_edges(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    """[a, b) of the pieces of sequences lo..hi a forward and backward take at once:
    `size` each (`rl.update_micro_batch`; 0: the whole range in one piece)."""
    if size <= 0 or hi - lo <= size:
        return [(lo, hi)]
    return [(a, min(a + size, hi)) for a in range(lo, hi, size)]


def minibatch(batch: UpdateBatch, lo: int, hi: int, device: torch.device) -> Minibatch:
    """Sequences lo..hi of `batch`, padded and laid out on `device`."""
    tokens, mask = pad_sequences(batch.prompts[lo:hi], batch.responses[lo:hi])
    mask = mask[:, :-1]
    old = spread(batch.old_logprobs[lo:hi], mask)
    weights = None if batch.weights is None else spread(batch.weights[lo:hi], mask)
    return Minibatch(
        tokens=tokens.to(device),
        mask=mask.to(device),
        old_logprobs=old.to(device),
        temperatures=torch.tensor(batch.temperatures[lo:hi], device=device),
        advantages=batch.advantages[lo:hi].to(device),
        weights=None if weights is None else weights.to(device),
        routes=replay_tape(batch.routes, lo, hi, tokens.shape[1]),
    )

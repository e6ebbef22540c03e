"""Routing replay (R3, arXiv 2510.11370): the route tape, which the generator's forwards
record and the trainer's replay; both sides import it from here.

A `RouteTape` is handed to one forward (the model's `routes` argument, down to each MoE
layer): each MoE layer, in call order, hands it its own top-k expert ids. Recording, the tape
keeps them and the generator stores them per (slot, position) in its cache
(`zkl.generation.route_cache`), so a completion carries a compact int8/int16
[len(prompt) + len(response), layers, k] tensor, -1 where no route was computed (a
prefix-cache hit, the last token). Replaying, the tape gives each layer the generator's ids
for its tokens (`replay_batch` lays a batch's out) and counts how many of the trainer's own
choices differed; the layer then weights the replayed experts by its own router's
probabilities. A forward without a tape neither records nor replays.
"""

from __future__ import annotations

import torch


class RouteTape:
    """Record (`replay` None) or replay (`replay` [L, N, k], -1: the layer's own choice);
    `use=False` only counts how the layers' own choices differ from `replay`."""

    def __init__(self, replay: torch.Tensor | None = None, use: bool = True) -> None:
        self.replay = replay
        self.use = use
        self.recorded: list[torch.Tensor] = []  # each MoE layer's ids [N, k], in call order
        self.layer = 0
        self.decisions = 0  # (token, layer) pairs with a replayed route
        self.differing = torch.zeros((), dtype=torch.int64)  # of those, own choice != replayed
        self.token_differs: torch.Tensor | None = None  # [N]: any layer's choice differed

    def visit(self, own: torch.Tensor) -> torch.Tensor | None:
        """A layer's own ids [N, k] -> the ids to use instead ([N, k], -1 kept) or None."""
        if self.replay is None:
            self.recorded.append(own)
            return None
        given = self.replay[self.layer].to(own.device, torch.int64)
        self.layer += 1
        known = given[:, 0] >= 0
        differs = (own.sort(-1).values != given.sort(-1).values).any(-1) & known
        self.decisions += int(known.sum())
        self.differing = self.differing + differs.sum().cpu()
        previous = self.token_differs
        self.token_differs = differs if previous is None else previous | differs
        return given if self.use else None

    def counts(self) -> torch.Tensor:
        """float64 [4]: replayed (token, layer) decisions, those the layers chose otherwise,
        tokens with a replayed route, those with any layer's choice otherwise."""
        known = int((self.replay[0][:, 0] >= 0).sum()) if self.replay is not None else 0
        differ = 0 if self.token_differs is None else int(self.token_differs.sum())
        values = [self.decisions, int(self.differing), known, differ]
        return torch.tensor(values, dtype=torch.float64)


def routing_metrics(counts: torch.Tensor | list[float]) -> dict[str, float]:
    """The `routing/*` shares from summed `RouteTape.counts`."""
    decisions, differing, known, differ = (float(c) for c in counts)
    return {
        "routing/decision_mismatch_frac": differing / max(decisions, 1),
        "routing/token_mismatch_frac": differ / max(known, 1),
    }


def route_dtype(num_experts: int) -> torch.dtype:
    """The smallest signed integer holding every expert id and -1."""
    return torch.int8 if num_experts <= 127 else torch.int16


def replay_batch(routes: list[torch.Tensor], width: int) -> torch.Tensor:
    """Per-sequence routes [len_i, L, k] right-padded to a batch of `width` positions, as the
    tape replays them: [L, B * width, k], -1 at padding and wherever none was recorded."""
    num_layers, k = routes[0].shape[1:]
    out = torch.full((len(routes), width, num_layers, k), -1, dtype=routes[0].dtype)
    for i, r in enumerate(routes):
        out[i, : min(len(r), width)] = r[:width]
    return out.permute(2, 0, 1, 3).reshape(num_layers, len(routes) * width, k)

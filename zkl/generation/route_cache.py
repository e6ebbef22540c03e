"""The generator's side of routing replay: the route tape of a gen-path forward and the
routes it recorded, stored per (slot, position) in the cache (`zkl.routes` has the tape)."""

from __future__ import annotations

import torch

from zkl.routes import RouteTape


def recording(routes: torch.Tensor | None) -> RouteTape | None:
    """A tape for a gen-path forward: one that records where the cache keeps `routes`."""
    return None if routes is None else RouteTape()


def store(
    routes: torch.Tensor | None,
    tape: RouteTape | None,
    slots: torch.Tensor,
    positions: torch.Tensor,
    live: torch.Tensor | None = None,
) -> None:
    """The ids `tape` recorded in one forward ([L] x [B*T, k]) into `routes`
    [slots, max_len, L, k] at rows `slots` [B], `positions` [B, T]; rows where `live` [B] is
    False keep theirs. Device ops only (the decode step stays capturable)."""
    if routes is None or tape is None:
        return
    taken, tape.recorded = tape.recorded, []
    batch, width = positions.shape
    ids = torch.stack(taken, dim=1).view(batch, width, len(taken), -1).to(routes.dtype)
    rows = slots.unsqueeze(1).expand(batch, width)
    if live is not None:
        keep = live.view(batch, 1, 1, 1)
        ids = torch.where(keep, ids, routes[rows, positions])
    routes[rows, positions] = ids

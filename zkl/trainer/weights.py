"""The trainer's weights as others see them: bit fingerprints, and a sharded model's whole
tensors gathered one at a time for a refit."""

from __future__ import annotations

from collections.abc import Mapping

import torch

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def weight_digests(state: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """[num_tensors, 2] int64 fingerprints of each tensor's bits: their sum and sum of squares.

    Equal bits give equal rows, so an update that leaves the weights a refit sends unchanged
    (all advantages zero, a learning rate below bf16's resolution) shows as no changed row;
    the certificate fails such a step. Cheaper than keeping a copy of the weights.
    """
    rows = []
    for t in state.values():
        bits = t.detach().reshape(-1).view(_INT_OF_SIZE[t.element_size()]).long()
        rows.append(torch.stack([bits.sum(), (bits * bits).sum()]))
    return torch.stack(rows)


class GatheredWeights(Mapping):
    """A sharded model's whole weights, each tensor all-gathered when it is read: a refit
    copying them in one at a time holds one whole tensor beside the shards, not the model.

    Every rank must read the same names in the same order (each read is a collective).
    """

    def __init__(self, params, dtypes, device, gather) -> None:
        self.params, self.dtypes, self.device, self.gather = params, dtypes, device, gather

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.gather(self.params[name], self.dtypes[name], self.device)

    def __iter__(self):
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def shape(self, name: str) -> torch.Size:
        return self.params[name].shape

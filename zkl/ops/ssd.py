"""The Mamba-2 (SSD) chunk commit: the state at a chunk's end from the state at its start.

One definition for the train path's inter-chunk recurrence and for decode under
`mamba_chunked_decode`, which commits a row's state only when its chunk fills
(`zkl.ops.ssd_commit_rows_`, dispatched by `zkl.ops`' table). The CPU form here picks the
filled rows on the host; the CUDA form (`zkl.ops.cuda.ssd_commit_rows_`) is a Triton kernel
that reads the row flags on the device and updates the state in place (`zkl.ops.triton.ssd`),
so a decode step holds no host sync and a CUDA graph can capture it, with the same bits.
"""

from __future__ import annotations

import torch

from zkl.ops.invariant import ordered_sum


def decays(cum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From cum [b, 1, Q, H] (cumulative dt * A): each position's decay to the chunk's end
    [b, 1, Q, H] and the whole chunk's [b, H]; torch's exp on every path (the same bits)."""
    return torch.exp(cum[:, :, -1:] - cum), torch.exp(cum[:, 0, -1])


def commit(h: torch.Tensor, B: torch.Tensor, cum: torch.Tensor, xdt: torch.Tensor) -> torch.Tensor:
    """The state at a full chunk's end [b, H, P, N] from h [b, H, P, N] at its start; B [b, 1,
    Q, H, N], cum [b, 1, Q, H] (cumulative dt * A), xdt [b, 1, Q, H, P], all fp32."""
    to_end, decay = decays(cum)
    own = ordered_sum((B * to_end.unsqueeze(-1)).unsqueeze(-2) * xdt.unsqueeze(-1), dim=2)
    return decay[..., None, None] * h + own[:, 0]


def commit_rows_(
    state: torch.Tensor,
    slots: torch.Tensor,
    full: torch.Tensor,
    B: torch.Tensor,
    cum: torch.Tensor,
    xdt: torch.Tensor,
) -> None:
    """state[slots[r]] <- `commit` of it over row r's chunk, for the rows r where full[r];
    state [S, H, P, N] fp32, slots and full [b], the chunk tensors as `commit`'s.

    The CPU form: it picks the filled rows on the host (a read the CPU pays nothing for)."""
    if bool(full.any()):
        at = slots[full]
        state[at] = commit(state[at], B[full], cum[full], xdt[full])

"""A prefill tile that runs the blocks all its queries see without masks (`Tile.interior`)
gives the masked tile's bits, and decode still gives the prefill's (Triton's interpreter).

Where every key of a block is visible to every live query of the tile, each mask of the block
step is an identity, so the unmasked step computes the same operations on the same values;
the diagonal, a window's edge and the buffer's end stay masked. Checked bit for bit across
ragged tiles (padding queries), a head dim that does not fill its block, chunk merges and
one chunk, an offset prefill from cache rows, windows and sinks.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import INTERPRETED, NOT_INTERPRETED

pytest.importorskip("triton")
if not INTERPRETED:
    pytest.skip(NOT_INTERPRETED, allow_module_level=True)

from zkl.ops.triton import attention  # noqa: E402

SEQ = 300  # ragged against 64-query tiles and 128-key chunks


def _qkv(head_dim: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(9)
    return tuple(torch.randn(2, h, SEQ, head_dim, generator=g).to(dtype) for h in (4, 2, 2))


@pytest.mark.parametrize(
    ("head_dim", "dtype", "chunk", "window", "sinks"),
    [
        (16, torch.float32, 128, 0, False),
        (24, torch.float32, 128, 0, True),  # BLOCK_D 32: the loads keep their head-dim mask
        (16, torch.float32, 1 << 30, 0, False),
        pytest.param(16, torch.float16, 128, 70, True, marks=pytest.mark.slow),
    ],
)
def test_unmasked_interior_gives_the_masked_bits(head_dim, dtype, chunk, window, sinks):
    q, k, v = _qkv(head_dim, dtype)
    sink = torch.randn(4, generator=torch.Generator().manual_seed(2)) if sinks else None
    extra = {"chunk": chunk, "window": window, "sinks": sink}
    positions = torch.arange(SEQ).expand(2, SEQ)
    masked, interior = attention.Tile(64, 4, 2), attention.Tile(64, 4, 2, interior=True)
    ref = attention.prefill(q, k, v, positions, tile=masked, **extra)
    assert torch.equal(attention.prefill(q, k, v, positions, tile=interior, **extra), ref)

    cache_k = torch.zeros(3, 2, SEQ + 20, head_dim, dtype=dtype)
    cache_v = torch.zeros_like(cache_k)
    rows = torch.tensor([2, 0])
    cache_k[rows, :, :SEQ], cache_v[rows, :, :SEQ] = k, v
    part = attention.prefill(
        q[:, :, 100:], cache_k, cache_v, positions[:, 100:], rows, tile=interior, **extra
    )
    assert torch.equal(part, ref[:, :, 100:])
    for t in (0, 63, 64, 200, SEQ - 1):
        out = attention.decode(
            q[:, :, t : t + 1], cache_k, cache_v, torch.full((2, 1), t), rows, **extra
        )
        assert torch.equal(out[:, :, 0], ref[:, :, t]), t

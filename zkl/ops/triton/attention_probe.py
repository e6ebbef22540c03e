"""Which prefill tile and decode tile a device runs in zero mode: probed once, kept if exact.

A tile row never depends on the other rows, but a reduction's order follows the tile's
register layout; the large tiles are used only where this device shows they give the
reference tile's bits for scoring, prefill from the cache and decode of the same queries.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from zkl.ops.triton.attention_kernels import FP32_TILE, REF_M, REFERENCE, Tile, decode, prefill

# Large query tiles for prefill and scoring, fastest first; the probe keeps the first whose
# rows decode reproduces bit for bit. None of them lets the compiler contract: where it fuses
# a mul and an add depends on the kernel around them, so two kernels that both allow it can
# round one value differently (measured on an H200: 1 output in ~1,500 of a decode step at
# the 1.5B's shape, which a 5-query probe passed). Only explicit `tl.fma` is fused.
PREFILL_TILES = (
    Tile(64, 4, 3, interior=True),
    Tile(128, 8, 3, interior=True),
    Tile(128, 8, 3, nested=False),
    Tile(128, 8, 3, nested=True),
    Tile(64, 4, 3, nested=True),
    Tile(64, 4, 3),
)
_CHOICES: dict[tuple, object] = {}


@dataclass(frozen=True)
class Choice:
    prefill: Tile  # the query tile of prefill and scoring
    decode_rows: int  # decode's rows a program (the packed query heads of one KV head)


REFERENCE_CHOICE = Choice(REFERENCE, REF_M)
DECODE_ROWS = (REF_M, 64)  # 16 rows run mma.sync, 64 the warpgroup MMA


def decode_rows_for(tile: Tile) -> tuple[int, ...]:
    """Decode's row counts to try with a prefill tile, the one running the tile's kind of
    matrix instruction first: a rounding the probe's inputs happen not to show follows the
    instruction (measured on an H100 at the 1.5B's heads: 16-row decode against the 128-row
    prefill, 27 of 6.3M outputs apart; 64-row decode, none)."""
    first = DECODE_ROWS[1] if tile.rows >= DECODE_ROWS[1] else DECODE_ROWS[0]
    return (first, *(r for r in DECODE_ROWS if r != first))


def choose(head_dim: int, dtype: torch.dtype, device: torch.device) -> Choice:
    """The fastest prefill tile and a decode tile that the device shows to give one another's
    bits: scoring, prefill (also from the cache, at an offset) and decode of the same query.

    Probed once per (head dim, dtype, device) on seeded inputs spanning several chunks and
    ragged tiles, decoding every one of their queries (a rare rounding difference is a
    difference), never while a CUDA graph is captured (the reference is used then).
    """
    if dtype == torch.float32:
        return Choice(FP32_TILE, REF_M)
    key = (head_dim, dtype, str(device))
    if key in _CHOICES:
        return _CHOICES[key]
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return REFERENCE_CHOICE
    q, k, v, positions = probe_inputs(head_dim, dtype, device)
    seq = q.shape[2]
    at = torch.arange(seq, device=device)  # every query: a contraction flipped ~1 in 1,500
    slots = torch.zeros(len(at), dtype=torch.long, device=device)
    q_dec = q[0, :, at].unsqueeze(2).transpose(0, 1)  # [n, H, 1, D]: one query a row
    decoded: dict[int, torch.Tensor] = {}

    def decoded_by(rows: int) -> torch.Tensor:
        if rows not in decoded:
            decoded[rows] = decode(
                q_dec, k[:1], v[:1], at.view(-1, 1), slots, rows_per_program=rows
            )[:, :, 0]
        return decoded[rows]

    chosen = None
    for tile in (*PREFILL_TILES, REFERENCE):
        whole = prefill(q, k, v, positions, tile=tile)
        offset = prefill(q[:1, :, 333:], k, v, positions[:1, 333:], slots[:1], tile=tile)
        if not torch.equal(offset, whole[:1, :, 333:]):
            continue
        want = whole[0, :, at].transpose(0, 1)  # [n, H, D]
        rows = [r for r in decode_rows_for(tile) if torch.equal(decoded_by(r), want)]
        if rows:
            chosen = Choice(tile, rows[0])
            break
    if chosen is None:
        warnings.warn(
            f"attention: prefill and decode tiles do not agree bit for bit on this device for "
            f"head dim {head_dim} {dtype}; zero mode's generator and trainer may differ",
            stacklevel=2,
        )
        chosen = REFERENCE_CHOICE
    elif chosen.prefill != PREFILL_TILES[0]:
        warnings.warn(
            f"attention: prefill keeps {chosen.prefill.rows}-query tiles for head dim "
            f"{head_dim} {dtype} (a larger tile's bits differ on this device); slower",
            stacklevel=2,
        )
    _CHOICES[key] = chosen
    return chosen


def prefill_tile(head_dim: int, dtype: torch.dtype, device: torch.device) -> Tile:
    return choose(head_dim, dtype, device).prefill


def probe_inputs(head_dim: int, dtype: torch.dtype, device: torch.device, seq: int = 1300):
    """Seeded q [2, 4, seq, D], k/v [2, 2, seq, D] and positions: several chunks, ragged tiles."""
    g = torch.Generator(device="cpu").manual_seed(7)
    q = torch.randn(2, seq, 4, head_dim, generator=g).to(device, dtype).transpose(1, 2)
    k, v = (torch.randn(2, 2, seq, head_dim, generator=g).to(device, dtype) for _ in range(2))
    return q, k, v, torch.arange(seq, device=device).expand(2, seq)

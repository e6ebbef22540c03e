"""Counter-based random numbers: each value is a pure function of its integer keys.

Why not `torch.Generator`: a stateful generator ties a draw to everything drawn before it
and to the device it lives on. Here a value depends only on (keys..., index), so a
request's sample never depends on its batch neighbours, a weight's initial value is the
same on the CPU and on a GPU, and everything is vectorized. The mixer is a 32-bit integer
hash (two multiply-xorshift rounds) computed in int64 without overflow; the floats made
from it use only exact operations (int -> float of 24 bits, one multiply by a constant),
so CPU and CUDA give identical bits.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32): 16-bit halves of c keep int64 from overflowing."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash of x in [0, 2^32) (int64 tensor in and out)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _words(part: int | torch.Tensor, device) -> list[torch.Tensor]:
    """The two 32-bit words of a non-negative 64-bit key."""
    if isinstance(part, int):
        if not 0 <= part < 1 << 64:
            raise ValueError(f"a random key must be in [0, 2**64), got {part}")
        # torch.full, not torch.tensor: no host-to-device copy, so a CUDA graph can capture it
        return [
            torch.full((), w, dtype=torch.int64, device=device) for w in (part & MASK32, part >> 32)
        ]
    part = part.to(device=device, dtype=torch.int64)
    return [part & MASK32, (part >> 32) & MASK32]


def key(*parts: int | torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """Fold integer keys (Python ints below 2^64 or int64 tensors) into 32-bit hashes."""
    h = torch.full((), _GOLDEN, dtype=torch.int64, device=device)
    for part in parts:
        for word in _words(part, device):
            h = mix32(h ^ word)
            h = mix32((h + _GOLDEN) & MASK32)
    return h


def bits(keys: torch.Tensor, count: int, offset: int = 0) -> torch.Tensor:
    """32-bit hashes of indices offset .. offset+count-1 under each key: [...] -> [..., count]."""
    index = torch.arange(offset, offset + count, device=keys.device, dtype=torch.int64)
    low = mix32(keys.unsqueeze(-1) ^ (index & MASK32))
    return mix32(low ^ ((index >> 32) + _GOLDEN))


def uniform(keys: torch.Tensor, count: int, offset: int = 0) -> torch.Tensor:
    """fp32 values in (0, 1) on a 2^-24 grid: keys [...] -> [..., count]."""
    top24 = (bits(keys, count, offset) >> 8).to(torch.float32)
    return (top24 + 0.5) * (2.0**-24)


def gumbel(keys: torch.Tensor, count: int) -> torch.Tensor:
    """Gumbel(0, 1) noise: keys [...] -> fp32 [..., count] (index i's draw is `uniform`'s)."""
    return -torch.log(-torch.log(uniform(keys, count)))

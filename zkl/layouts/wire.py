"""The refit's wire format: a manifest of (name, dtype, shape) and every tensor's raw bytes in
one flat uint8 buffer, so the copy is bitwise whatever the dtype."""

from __future__ import annotations

import math

import torch

Manifest = list[tuple[str, str, list[int]]]
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int64)}


def pack(state: dict[str, torch.Tensor]) -> tuple[Manifest, torch.Tensor]:
    """A manifest (name, dtype, shape) and the tensors' raw bytes in one uint8 buffer."""
    manifest = [(name, str(t.dtype), list(t.shape)) for name, t in state.items()]
    flat = torch.cat(
        [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in state.values()]
    )
    return manifest, flat


def unpack(manifest: Manifest, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of `flat` by the manifest; a buffer of another size than it describes is refused."""
    out, offset = {}, 0
    for name, dtype, shape in manifest:
        dt = _DTYPES[dtype]
        nbytes = math.prod(shape) * dt.itemsize
        out[name] = flat[offset : offset + nbytes].view(dt).reshape(shape)
        offset += nbytes
    if offset != flat.numel():
        raise RuntimeError(f"refit buffer has {flat.numel()} bytes, the manifest {offset}")
    return out

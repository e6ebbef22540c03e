"""KV cache: one buffer pair per layer, one row ("slot") per running request."""

from __future__ import annotations

import torch

from zkl.ops.fast import write_kv


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, S, Hkv, max_len, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    def update(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, Hkv, T, D] at `positions` [B, T] of `slots` [B].

        Returns the layer's whole K, V buffers [S, Hkv, max_len, D]; attention reads the
        rows' slots in place.
        """
        cache_k, cache_v = self.layer(layer)
        write_kv(cache_k, cache_v, slots, positions, k.transpose(1, 2), v.transpose(1, 2))
        return cache_k, cache_v

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K, V buffers [S, Hkv, max_len, D] (a fused RoPE writes them in place)."""
        return self.k[layer], self.v[layer]

    def clear_slot(self, slot: int) -> None:
        """A new request takes `slot`; stale K/V need no clearing (attention masks them)."""

    def write(self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Place K, V [Hkv, n, D] at positions 0..n-1 of `slot`."""
        n = k.shape[1]
        self.k[layer, slot, :, :n] = k
        self.v[layer, slot, :, :n] = v

"""KV cache: one buffer pair per layer, one row ("slot") per running request.

Besides the buffers, a cache says how prefill may treat its rows (zkl/generation/prefill.py):
whether rows of different lengths may share a padded batch, and how a prefix-cache hit is
put back into a row.
"""

from __future__ import annotations

import torch

from zkl.ops.fast import write_kv


class KVCache:
    pads_rows = True  # rows of different lengths may prefill in one right-padded batch
    # [slots, max_len, MoE layers, k] expert ids the gen path chose at each position, -1 where
    # none was computed; set by the scheduler when it records routes (routing replay), else None
    routes: torch.Tensor | None = None

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
        """A new request takes `slot`; stale K/V need no clearing (attention masks them), its
        routes do (none is known until its prefill computes it)."""
        if self.routes is not None:
            self.routes[slot] = -1

    def write(self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Place K, V [Hkv, n, D] at positions 0..n-1 of `slot`."""
        n = k.shape[1]
        self.k[layer, slot, :, :n] = k
        self.v[layer, slot, :, :n] = v

    def resumable(self, blocks: list) -> list:
        """The prefix-cache blocks (`prefix_cache.Entry`) a row can resume after: all."""
        return blocks

    def load_prefix(self, slot: int, blocks: list) -> int:
        """Put the blocks' K/V at positions 0.. of `slot`; how many tokens they hold."""
        k = torch.cat([b.k for b in blocks], dim=2)  # [L, Hkv, n, D]
        v = torch.cat([b.v for b in blocks], dim=2)
        for layer in range(k.shape[0]):
            self.write(layer, slot, k[layer], v[layer])
        return k.shape[2]

    def state_boundary(self, prompt_len: int) -> int:
        """Where a row's prefill stops to hand its recurrent state to the prefix cache: K/V
        alone need no stop (0)."""
        return 0

"""Mamba state beside the KV cache: per Mamba layer and slot, conv history and SSM state.

`ssm` is fp32: with `mamba_chunked_decode` it is the state at the row's last chunk boundary
and `buf_xbc` / `buf_dt` hold the post-conv inputs of the current partial chunk; with the
fix off it is the running state rounded to the model dtype and the buffers are unused.
"""

from __future__ import annotations

import torch

from zkl.generation.kv_cache import KVCache


class HybridCache(KVCache):
    """KV rows for the attention layers plus Mamba rows for the Mamba layers."""

    def __init__(self, model: torch.nn.Module, num_slots: int, max_len: int, dtype, device):
        cfg = model.cfg
        super().__init__(
            model.num_attention_layers,
            num_slots,
            cfg.num_key_value_heads,
            max_len,
            cfg.head_dim,
            dtype,
            device,
        )
        layers, heads = model.num_mamba_layers, cfg.mamba_num_heads
        conv_dim = heads * cfg.mamba_head_dim + 2 * cfg.n_groups * cfg.ssm_state_size
        shape = (layers, num_slots)
        self.conv = torch.zeros(*shape, cfg.conv_kernel - 1, conv_dim, dtype=dtype, device=device)
        self.ssm = torch.zeros(
            *shape, heads, cfg.mamba_head_dim, cfg.ssm_state_size, device=device
        )  # [M, S, H, P, N] fp32
        self.buf_xbc = torch.zeros(*shape, cfg.chunk_size, conv_dim, dtype=dtype, device=device)
        self.buf_dt = torch.zeros(*shape, cfg.chunk_size, heads, device=device)

    def clear_slot(self, slot: int) -> None:
        """A new request takes `slot`: its Mamba state starts from zero."""
        for t in (self.conv, self.ssm, self.buf_xbc, self.buf_dt):
            t[:, slot] = 0

    def mamba_state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv history, SSM state) of `slot`, copied (for the prefix cache)."""
        return self.conv[:, slot].clone(), self.ssm[:, slot].clone()

    def restore(self, slot: int, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Put a prefix-cache state at a chunk boundary back into `slot` (empty partial chunk)."""
        self.clear_slot(slot)
        self.conv[:, slot], self.ssm[:, slot] = state

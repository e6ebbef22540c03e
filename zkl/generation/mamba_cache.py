"""Mamba state beside the KV cache: per Mamba layer and slot, conv history and SSM state.

`ssm` is fp32: with `mamba_chunked_decode` it is the state at the row's last chunk boundary
and `buf_xbc` / `buf_dt` hold the post-conv inputs of the current partial chunk; with the
fix off it is the running state rounded to the model dtype and the buffers are unused.
"""

from __future__ import annotations

import math

import torch

from zkl.generation.kv_cache import KVCache
from zkl.generation.prefix_cache import BLOCK


class HybridCache(KVCache):
    """KV rows for the attention layers plus Mamba rows for the Mamba layers."""

    pads_rows = False  # a Mamba state must never see padding: prefill one row at a time

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
        mamba = cfg.mamba
        layers, heads = model.num_mamba_layers, mamba.num_heads
        conv_dim = heads * mamba.head_dim + 2 * mamba.num_groups * mamba.state_size
        shape = (layers, num_slots)
        self.conv = torch.zeros(*shape, mamba.conv_kernel - 1, conv_dim, dtype=dtype, device=device)
        self.ssm = torch.zeros(
            *shape, heads, mamba.head_dim, mamba.state_size, device=device
        )  # [M, S, H, P, N] fp32
        self.buf_xbc = torch.zeros(*shape, mamba.chunk_size, conv_dim, dtype=dtype, device=device)
        self.buf_dt = torch.zeros(*shape, mamba.chunk_size, heads, device=device)
        # a prefix hit resumes the chunk scan at a chunk boundary with an empty partial
        # chunk: only at multiples of both the prefix block and the Mamba chunk
        self.resume_span = math.lcm(BLOCK, mamba.chunk_size)

    def clear_slot(self, slot: int) -> None:
        """A new request takes `slot`: its Mamba state starts from zero."""
        super().clear_slot(slot)
        for t in (self.conv, self.ssm, self.buf_xbc, self.buf_dt):
            t[:, slot] = 0

    def row_state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv history, SSM state) of `slot`, copied (for the prefix cache)."""
        return self.conv[:, slot].clone(), self.ssm[:, slot].clone()

    def restore(self, slot: int, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Put a prefix-cache state at a chunk boundary back into `slot` (empty partial chunk)."""
        self.clear_slot(slot)
        self.conv[:, slot], self.ssm[:, slot] = state

    def resumable(self, blocks: list) -> list:
        """The blocks up to the last one that carries the Mamba state after it."""
        blocks = list(blocks)
        while blocks and blocks[-1].mamba is None:
            blocks.pop()
        return blocks

    def load_prefix(self, slot: int, blocks: list) -> int:
        """K/V of the blocks, then the Mamba state after the last one."""
        num_tokens = super().load_prefix(slot, blocks)
        self.restore(slot, blocks[-1].mamba)
        return num_tokens

    def state_boundary(self, prompt_len: int) -> int:
        """The last resumable position inside the prompt (one token is always prefilled)."""
        return (prompt_len - 1) // self.resume_span * self.resume_span

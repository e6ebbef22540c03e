"""zkl's core-attention slot in megatron-core: where zkl's KV cache and rotary plug in.

`CacheAttention` is mixed into the engine's own core-attention class (megatron's
`DotProductAttention` on the local spec, `TEDotProductAttention` on the TE specs): it applies
zkl's rotary at each token's absolute position, writes K/V to the cache rows of the batch
(`Step`), and attends over them; with `attention_fixed_split` on through `zkl.ops.attention`,
off through the engine's own attention.

Imports megatron-core (Python >= 3.12).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from zkl import ops
from zkl.ops import fast


@dataclass
class Step:
    """What one forward's attention needs beyond megatron's arguments; set by the model.

    positions [B, T] (absolute); cache/slots for the gen path (None on the train path);
    rope: zkl's rotary tables.
    """

    rope: torch.nn.Module
    positions: torch.Tensor | None = None
    cache: object | None = None
    slots: torch.Tensor | None = None


class CacheAttention:
    """Core attention over zkl's KV cache, at absolute positions (continuous batching); mixed
    into the engine's own core-attention class, whose attention `_engine_attention` runs.

    q/k/v arrive as megatron's [T, B, heads, D] before any rotary (the model is built with
    no megatron position embedding); the rotary is zkl's, so train and gen apply it alike.
    """

    def __init__(self, *args, step: Step, **kwargs):
        super().__init__(*args, **kwargs)
        self.step = step

    def forward(
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        step = self.step
        positions = step.positions  # [B, T]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [B, H, T, D]
        q, k = step.rope(q, positions), step.rope(k, positions)
        kv_rows = None
        if step.cache is not None:  # K/V to the cache first; attention reads the rows' slots
            k, v = step.cache.update(self.layer_number - 1, step.slots, positions, k, v)
            kv_rows = step.slots
        # A graph's step cannot read positions back, which the engine's own attention needs:
        # there the default path runs zkl's (flash-decoding on CUDA) instead.
        if ops.runs_invariant("attention") or fast.shapes_are_static(q.device):
            out = ops.attention(q, k, v, positions, kv_rows)  # [B, H, T, D]
            return out.permute(2, 0, 1, 3).reshape(q.shape[2], q.shape[0], -1)
        if kv_rows is not None:
            k, v = k[kv_rows], v[kv_rows]
        num_keys = int(positions.max().item()) + 1
        k, v = k[:, :, :num_keys], v[:, :, :num_keys]
        return self._engine_attention(
            *(t.permute(2, 0, 1, 3) for t in (q, k, v)), positions
        )  # [T, B, H * D]

    def _engine_attention(self, q, k, v, positions):
        """q [T, B, H, D], k/v [K, B, Hkv, D] (key j at position j) -> [T, B, H * D]."""
        raise NotImplementedError


class ZklCoreAttention(CacheAttention, DotProductAttention):
    """The local spec's slot: with `attention_fixed_split` off, megatron's
    `DotProductAttention` math over the visible keys with an explicit mask."""

    def _engine_attention(self, q, k, v, positions):
        masked = torch.arange(k.shape[0], device=q.device) > positions.unsqueeze(-1)  # [B, T, K]
        return DotProductAttention.forward(
            self,
            q,
            k,
            v,
            masked.unsqueeze(1),  # [B, 1, T, K], True = not visible (megatron's convention)
            attn_mask_type=AttnMaskType.arbitrary,
        )


def bottom_right_seqlens(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens_q, cu_seqlens_kv) [B + 1] int32 that make a bottom-right causal mask over
    padded rows equal zkl's rule (a query at position p sees keys 0..p) for every query
    whose output is read.

    zkl's rows hold consecutive positions, right-padded: scoring's 0..T-1, a prefill chunk's
    start..start+T-1 with its pads clamped at the cache's last slot (never a real token's),
    a decode step's one position. Row b's keys are 0..max(positions[b]); its queries are
    those up to the first at that maximum. Computed on the device (no host read).
    """
    last = positions.max(dim=1, keepdim=True).values  # [B, 1]
    kv_len = last[:, 0] + 1
    q_len = positions.shape[1] - (positions == last).sum(dim=1) + 1
    zero = positions.new_zeros(1)
    cu_q, cu_kv = (torch.cat([zero, n.cumsum(0)]).to(torch.int32) for n in (q_len, kv_len))
    return cu_q, cu_kv


def te_core_attention_class(base: type) -> type:
    """`CacheAttention` mixed into Transformer Engine's `base` (megatron's
    `TEDotProductAttention`): with `attention_fixed_split` off, TE's own attention (cuDNN's
    fused kernel where it serves) runs over the visible keys, as a bottom-right causal mask
    over padded rows (`bottom_right_seqlens`)."""

    from transformer_engine.pytorch import DotProductAttention as TEAttention

    def _engine_attention(self, q, k, v, positions):
        cu_q, cu_kv = bottom_right_seqlens(positions)
        # TE's own forward: megatron's wrapper names its masks by megatron's AttnMaskType,
        # which has no padded bottom-right causal mask.
        out = TEAttention.forward(
            self,
            *(t.contiguous() for t in (q, k, v)),
            qkv_format="sbhd",
            cu_seqlens_q=cu_q,
            cu_seqlens_kv=cu_kv,
            max_seqlen_q=q.shape[0],
            max_seqlen_kv=k.shape[0],
            attn_mask_type="padding_causal_bottom_right",
        )
        return out.reshape(q.shape[0], q.shape[1], -1)

    return type(
        f"ZklCore{base.__name__}",
        (CacheAttention, base),
        {"_engine_attention": _engine_attention, "__doc__": te_core_attention_class.__doc__},
    )

"""The default path's attention on CUDA: what a fast generator runs, train/gen mismatch and all."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from zkl.ops.fast import attention_with_sinks, visible_keys
from zkl.ops.triton.attention_kernels import KEY_BLOCK, REF_M, Tile, decode, prefill
from zkl.ops.triton.gemm import sm_count

DEFAULT_TILE = Tile(128, 8, 3, fp_fusion=True)  # the default path: contraction, as fast kernels


def default_chunk(num_rows: int, num_kv_heads: int, num_keys: int, sms: int) -> int:
    """The default path's decode split (flash-decoding's rule): chunks sized so the
    programs fill the device about twice; it follows the batch, so bits do too."""
    splits = max(1, triton.cdiv(2 * sms, max(1, num_rows * num_kv_heads)))
    size = triton.next_power_of_2(max(1, triton.cdiv(num_keys, splits)))
    return max(KEY_BLOCK * 4, size)


def _from_zero(q_pos: torch.Tensor) -> bool:
    """Whether every row's positions are 0..T-1 (one host read; never inside a graph)."""
    if q_pos.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return bool((q_pos == torch.arange(q_pos.shape[-1], device=q_pos.device)).all())


def window_mask(num_q: int, window: int, device: torch.device) -> torch.Tensor:
    """[Tq, Tq] bool: query i sees keys i-window+1..i (queries at positions 0..T-1)."""
    return visible_keys(torch.arange(num_q, device=device), num_q, window)


def attention_default(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """What a fast generator runs on CUDA, mismatch and all: PyTorch's SDPA where the queries are
    the keys (scoring, the train forward; flash without a window; with sinks, which SDPA
    lacks, the eager form), flash-decoding with a batch-dependent split for decode, and one
    unmerged pass over the cache for prefill."""
    if kv_rows is None and q.shape[2] == k.shape[2] > 1 and _from_zero(q_pos):
        if sinks is not None:
            return attention_with_sinks(q, k, v, q_pos, sinks, window)
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if window and window < q.shape[2]:
            mask = window_mask(q.shape[2], window, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if q.shape[2] == 1 and q.shape[1] // k.shape[1] <= REF_M:
        chunk = default_chunk(q.shape[0], k.shape[1], k.shape[2], sm_count(q.device))
        return decode(
            q, k, v, q_pos, kv_rows, chunk=chunk, rows_per_program=REF_M, fp_fusion=True,
            window=window, sinks=sinks,
        )  # fmt: skip
    return prefill(
        q, k, v, q_pos, kv_rows, tile=DEFAULT_TILE, chunk=1 << 30, window=window, sinks=sinks
    )

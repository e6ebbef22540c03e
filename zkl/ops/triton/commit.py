"""The decode step's bookkeeping in one launch: each row's sampled token and logprob into
its slot's outputs, its count, position, next input and done flag updated.

In torch ops this is some thirty tiny kernels a step (gathers, `where`s, index_puts), about
as much launch time as a layer's GEMMs at small batches. It is integer and copy work only,
so the bits are torch's (`zkl.ops.fast.commit_samples` is the reference form).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _commit_kernel(
    rows_ptr,
    next_ptr,
    logprob_ptr,
    token_ptr,
    pos_ptr,
    count_ptr,
    done_ptr,
    max_new_ptr,
    out_tokens_ptr,
    out_logprobs_ptr,
    num_rows,
    width,
    s_tokens,
    s_logprobs,
    eos_id,
    HAS_EOS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.arange(0, BLOCK)
    valid = i < num_rows
    slot = tl.load(rows_ptr + i, mask=valid, other=0).to(tl.int64)
    token = tl.load(next_ptr + i, mask=valid, other=0)
    logprob = tl.load(logprob_ptr + i, mask=valid, other=0.0)
    done = tl.load(done_ptr + slot, mask=valid, other=1) != 0
    live = valid & ~done
    count = tl.load(count_ptr + slot, mask=valid, other=0)
    column = tl.minimum(count, width - 1)
    tl.store(out_tokens_ptr + slot * s_tokens + column, token, mask=live)
    tl.store(out_logprobs_ptr + slot * s_logprobs + column, logprob, mask=live)
    count = count + live.to(count.dtype)
    finished = count >= tl.load(max_new_ptr + slot, mask=valid, other=0)
    if HAS_EOS:
        finished = finished | (token == eos_id)
    tl.store(count_ptr + slot, count, mask=valid)
    tl.store(token_ptr + slot, token, mask=live)
    pos = tl.load(pos_ptr + slot, mask=valid, other=0)
    tl.store(pos_ptr + slot, pos + live.to(pos.dtype), mask=valid)
    tl.store(done_ptr + slot, done | (live & finished), mask=valid)


def commit_samples(
    state, rows: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor, eos_id: int | None
) -> None:
    """`zkl.ops.commit_samples` in one launch (`state`: the scheduler's per-slot tensors)."""
    num_rows = rows.shape[0]
    if num_rows == 0:
        return
    for name in ("token", "pos", "count", "done", "max_new"):
        if not getattr(state, name).is_contiguous():
            raise ValueError(f"commit_samples needs a contiguous state.{name}")
    out_tokens, out_logprobs = state.out_tokens, state.out_logprobs
    _commit_kernel[(1,)](
        rows.contiguous(),
        tokens.contiguous(),
        logprobs.to(out_logprobs.dtype).contiguous(),
        state.token,
        state.pos,
        state.count,
        state.done,
        state.max_new,
        out_tokens,
        out_logprobs,
        num_rows,
        out_tokens.shape[1],
        out_tokens.stride(0),
        out_logprobs.stride(0),
        -1 if eos_id is None else eos_id,
        HAS_EOS=eos_id is not None,
        BLOCK=max(16, triton.next_power_of_2(num_rows)),
    )

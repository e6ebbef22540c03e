"""The kernels every engine path calls; each picks its form by device and named fix.

Per fix: off -> `fast` (what a default engine runs on any device); on -> the invariant form
of the tensor's device: `invariant` (CPU reference, the spec) or `cuda` (Triton kernels).
No model or engine code branches on the device.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

import torch

from zkl.invariance import is_enabled
from zkl.ops import fast, invariant


def _cuda() -> ModuleType:
    return importlib.import_module("zkl.ops.cuda")


def _invariant_for(t: torch.Tensor) -> ModuleType:
    return _cuda() if t.is_cuda else invariant


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    impl = _invariant_for(x) if is_enabled("batch_invariant_gemm") else fast
    return impl.linear(x, weight, bias)


def grouped_linear(
    x: torch.Tensor, weights: Sequence[torch.Tensor], offsets: torch.Tensor
) -> torch.Tensor:
    """The MoE experts' GEMMs: x [M, K] with rows grouped at offsets [E + 1] (x's device) ->
    [M, N], group e @ weights[e].T (each [N, K], no bias).

    With `batch_invariant_gemm` each row equals the dense `linear`'s row of its expert,
    whatever the other groups hold. On CUDA one launch reads the offsets on the device (no
    host sync: a CUDA graph can hold it); the CPU loops over the groups on the host.
    """
    fixed = is_enabled("batch_invariant_gemm")
    if x.is_cuda:
        cuda = _cuda()
        impl = cuda.grouped_linear if fixed else cuda.grouped_linear_default
        return impl(x, weights, offsets)
    return (invariant if fixed else fast).grouped_linear(x, weights, offsets)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    impl = _invariant_for(x) if is_enabled("batch_invariant_reductions") else fast
    return impl.rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta, weight)): the residual stream and the next layer's input.

    One fused pass where the invariant CUDA norm runs and no gradient is wanted (its bits are
    the add's then the norm's); elsewhere the add, then `rms_norm`.
    """
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or delta.requires_grad)
    if x.is_cuda and is_enabled("batch_invariant_reductions") and not needs_grad:
        return _cuda().add_rms_norm(x, delta, weight, eps)
    total = x + delta
    return total, rms_norm(total, weight, eps)


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE of q [B, T, Hq, D] and k [B, T, Hkv, D] at positions [B, T]: new [B, T, H, D].

    Not a fix: on CUDA without gradients one fused pass gives the torch form's bits.
    """
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    impl = _cuda() if q.is_cuda and not needs_grad else fast
    return impl.rotary(q, k, cos, sin, positions)


def rotary_into_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """`rotary`, then rotated k and v written to one layer's cache [S, Hkv, L, D] at row
    slots[b], position positions[b, t]; returns the rotated q. The gen path's (no grad)."""
    impl = _cuda() if q.is_cuda else fast
    return impl.rotary_into_cache(q, k, v, cos, sin, positions, cache_k, cache_v, slots)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up. Not a fix: on CUDA every path runs the one fused Triton pass (its
    exponential is Triton's), so the train and gen paths share it in every mode."""
    impl = _cuda() if gate.is_cuda else fast
    return impl.silu_mul(gate, up)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """fp32 softmax over the last dim (the MoE router); invariant with the reductions fix."""
    impl = _invariant_for(x) if is_enabled("batch_invariant_reductions") else fast
    return impl.softmax(x)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention: q [B, H, Tq, D], k/v [R, Hkv, Tk, D] (key j at position j).

    q_pos [B, Tq] are the queries' absolute positions; batch row b reads the keys of row
    `kv_rows[b]` (the KV-cache slot; default b); `window` W > 0 (sliding window): a query at
    p sees only the keys p-W+1..p. `sinks` [H] (gpt-oss): one more logit per head in the
    softmax's denominator, with no value.
    """
    extra = {"window": window, "sinks": sinks}
    if is_enabled("attention_fixed_split"):
        return _invariant_for(q).attention(q, k, v, q_pos, kv_rows, **extra)
    if q.is_cuda:  # flash for scoring, flash-decoding for decode, as a fast engine runs
        return _cuda().attention_default(q, k, v, q_pos, kv_rows, **extra)
    return fast.attention(q, k, v, q_pos, kv_rows, **extra)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """The one logprob path: fp32 log-softmax of raw `logits / temperature`, gathered at tokens.

    logits [..., V], tokens [...] -> fp32 [...]; a tensor temperature broadcasts as [..., 1]
    (fp32, so it divides exactly as the same Python float would). The trainer always uses
    it; the generator does when `logprob_path` is on. Its vocab reduction is invariant with
    `batch_invariant_reductions` (CPU: torch's, measured row-invariant; CUDA: Triton).
    """
    if logits.is_cuda and is_enabled("batch_invariant_reductions"):
        return _invariant_for(logits).token_logprobs(logits, tokens, temperature)
    return fast.token_logprobs(logits, tokens, temperature)


def commit_samples(
    state, rows: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor, eos_id: int | None
) -> None:
    """The decode step's bookkeeping, in place on the engine's slot state (`SlotState`):
    tokens [B] and logprobs [B] of the slots `rows` [B] into their outputs; count, position,
    next input and done flag updated; finished rows untouched. On CUDA one launch instead of
    some thirty (integer and copy work: the same bits)."""
    impl = _cuda() if rows.is_cuda else fast
    impl.commit_samples(state, rows, tokens, logprobs, eos_id)


def gumbel_argmax(
    scores: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gumbel-max sampling: first argmax of scores [B, V] (divided by `temperature` [B] in
    fp32 when given) + `zkl.rng.gumbel(zkl.rng.key(seeds, counters), V)`.

    Not a fix (every mode samples this way, and a row's draw never reads another row): on
    CUDA one fused Triton pass replaces the noise's forty int64 passes over [B, V], the
    key's hundred tiny kernels and the temperature's fp32 copy of the logits.
    """
    if scores.is_cuda:
        return _cuda().gumbel_argmax(scores, seeds, counters, temperature)
    return fast.gumbel_argmax(scores, seeds, counters, temperature)

"""The ordinary fast PyTorch path: what a fast generator does, mismatch and all."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from zkl import rng
from zkl.ops import activations
from zkl.ops.invariant import grouped_by_host_loop
from zkl.switch import Switch

_STATIC_SHAPES: Switch[bool] = Switch("static_shapes", False)


@contextmanager
def static_shapes() -> Iterator[None]:
    """Shapes fixed by the buffers, nothing read back to the host: how a CUDA graph's step
    must run. Its warm-up runs under it too, so the kernels the capture records (and their
    cuDNN plans, built on first use) are the ones warmed up, never built while capturing."""
    with _STATIC_SHAPES.scoped(True):
        yield


def shapes_are_static(device: torch.device) -> bool:
    """Whether this step must not read back to the host (`static_shapes`, or a capture)."""
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    return _STATIC_SHAPES.get() or capturing


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def grouped_linear(
    x: torch.Tensor, weights: Sequence[torch.Tensor], offsets: torch.Tensor
) -> torch.Tensor:
    """Group e (rows offsets[e]:offsets[e + 1]) @ weights[e].T, one `F.linear` a group: the
    CPU's fast form (a host loop costs it nothing; CUDA's is one grouped Triton launch)."""
    return grouped_by_host_loop(linear, x, weights, offsets)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)): the add, then the norm."""
    total = x + delta
    return total, rms_norm(total, weight, eps)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), dim=-1)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def gumbel_argmax(
    scores: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor | None = None,
) -> torch.Tensor:
    if temperature is not None:
        scores = scores.float() / temperature.unsqueeze(-1)
    keys = rng.key(seeds, counters, device=scores.device)
    return (scores + rng.gumbel(keys, scores.shape[-1])).argmax(dim=-1)


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE of q [B, T, Hq, D] and k [B, T, Hkv, D] at positions [B, T] (tables [P, D], fp32)."""
    return rotate(q, cos, sin, positions), rotate(k, cos, sin, positions)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor):
    """x [B, T, H, D] -> x * cos + rotate_half(x) * sin in fp32, rounded to x's dtype."""
    cos = cos[positions].unsqueeze(2)  # [B, T, 1, D]
    sin = sin[positions].unsqueeze(2)
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def rotary_into_cache(q, k, v, cos, sin, positions, cache_k, cache_v, slots) -> torch.Tensor:
    """Rotated q out; rotated k and v into cache_k/v [S, Hkv, L, D] at (slots[b], positions)."""
    q, k = rotary(q, k, cos, sin, positions)
    write_kv(cache_k, cache_v, slots, positions, k, v)
    return q


def write_kv(cache_k, cache_v, slots, positions, k: torch.Tensor, v: torch.Tensor) -> None:
    """k, v [B, T, Hkv, D] into one layer's cache [S, Hkv, L, D] at (slots[b], positions[b, t])."""
    rows = slots.unsqueeze(-1).expand_as(positions)  # [B, T]
    cache_k[rows, :, positions] = k.to(cache_k.dtype)  # the indexed view is [B, T, Hkv, D]
    cache_v[rows, :, positions] = v.to(cache_v.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up: the CPU's one form (both cells), with `zkl.ops.activations`' silu,
    since torch's CPU silu rounds an element by its place in the tensor."""
    return activations.silu(gate) * up


def commit_samples(
    state, rows: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor, eos_id: int | None
) -> None:
    """Each row's sampled token and logprob into slot rows[i]'s outputs; its count, position,
    next input and done flag updated. A finished (done) row's slot is left as it was."""
    live = ~state.done[rows]
    count = state.count[rows]
    column = count.clamp(max=state.out_tokens.shape[1] - 1)
    old_tokens = state.out_tokens[rows, column]
    old_logprobs = state.out_logprobs[rows, column]
    state.out_tokens[rows, column] = torch.where(live, tokens, old_tokens)
    state.out_logprobs[rows, column] = torch.where(live, logprobs, old_logprobs)
    count = count + live.long()
    finished = count >= state.max_new[rows]
    if eos_id is not None:
        finished |= tokens == eos_id
    state.count[rows] = count
    state.token[rows] = torch.where(live, tokens, state.token[rows])
    state.pos[rows] = state.pos[rows] + live.long()
    state.done[rows] = state.done[rows] | (live & finished)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """SDPA: `is_causal` when queries are the keys (scoring, whole prefill), else a mask;
    `window` W > 0 keeps the keys p-W+1..p of a query at p. With `sinks` (SDPA has none)
    the eager form: the sink as one more softmax column.

    Under `static_shapes` (a CUDA graph's step, its warm-up included) nothing may be read
    back to the host: the mask then spans the whole cache instead of the keys up to the
    last position.
    """
    if sinks is not None:
        if kv_rows is not None:
            k, v = k[kv_rows], v[kv_rows]
        return attention_with_sinks(q, k, v, q_pos, sinks, window)
    static = shapes_are_static(q.device)
    # the keys up to the batch's last position (the whole buffer where nothing may be read
    # back), each row's cache slot gathered only after that cut
    num_keys = k.shape[2] if static else int(q_pos.max().item()) + 1
    if kv_rows is not None:
        k, v = k[kv_rows, :, :num_keys], v[kv_rows, :, :num_keys]
    else:
        k, v = k[:, :, :num_keys], v[:, :, :num_keys]
    enable_gqa = q.shape[1] != k.shape[1]
    if not static:
        num_q = q.shape[2]
        starts_at_zero = bool((q_pos == torch.arange(num_q, device=q.device)).all())
        if starts_at_zero and num_keys == num_q and not 0 < window < num_keys:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
    mask = visible_keys(q_pos, k.shape[2], window)  # [B, Tq, Tk]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.unsqueeze(1), enable_gqa=enable_gqa
    )


def visible_keys(q_pos: torch.Tensor, num_keys: int, window: int = 0) -> torch.Tensor:
    """[..., Tq, num_keys] bool: which keys each query sees. A query at p sees the keys
    0..p, or with `window` W > 0 only p-W+1..p: the one mask of the eager forms."""
    keys = torch.arange(num_keys, device=q_pos.device)
    visible = keys <= q_pos.unsqueeze(-1)
    if window:
        visible &= keys > q_pos.unsqueeze(-1) - window
    return visible


def attention_with_sinks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    sinks: torch.Tensor,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention whose softmax has one more logit per head, `sinks` [H], with no value
    (gpt-oss), in the activation dtype as an eager implementation computes it; `window` as
    `attention`'s. Keys are the whole buffer, masked: nothing is read back to the host."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5  # [B, H, Tq, Tk]
    visible = visible_keys(q_pos, k.shape[2], window)  # [B, Tq, Tk]
    scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)

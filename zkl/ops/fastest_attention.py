"""The default path's attention on CUDA: the fastest form this device has for a call's shape.

A fast generator runs whichever attention kernel is fastest on its GPU; the default path's bits
may follow the batch, so nothing ties it to one kernel. The candidates are every
non-invariant form the machine has:
- `sdpa`: PyTorch's scaled_dot_product_attention (`zkl.ops.fast.attention`: flash for the
  train forward and scoring; for the scheduler's cache, each row's keys gathered up to the
  batch's last position, or the whole buffer masked inside a CUDA graph);
- `flash-attn-4`: flash-attn-4 with the split count its own heuristic picks (one on Hopper,
  which refuses a split), over the cache by a page table;
- `triton`: zkl's default Triton kernels (`attention_default.py`): flash-decoding with a
  batch-dependent split for decode, one unmerged pass for a prefill over the cache.
The first call of each shape (`_key`: the kind of call, its sizes, rounded up to a power of
two where a run's calls vary) times every candidate on that call's own inputs and keeps the
fastest; a CUDA graph's warm-up makes the choice its capture replays. `chosen()` says what
each shape runs, for the benchmarks.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import triton

from zkl.ops import fa4, fast
from zkl.ops.triton import attention as triton_attention

Form = Callable[..., torch.Tensor]
_CHOSEN: dict[tuple, str] = {}
TIMED_CALLS = 3


def _flash_attn_4(q, k, v, q_pos, kv_rows=None, window=0, sinks=None) -> torch.Tensor:
    splits = fa4.own_splits(q.device)
    return fa4.attention(q, k, v, q_pos, kv_rows, window=window, sinks=sinks, num_splits=splits)


FORMS: dict[str, Form] = {
    "sdpa": fast.attention,
    "flash-attn-4": _flash_attn_4,
    "triton": triton_attention.attention_default,
}
# What a call runs where nothing can be timed (a capture with no warm-up before it, Triton's
# interpreter on the CPU): forms that read nothing back to the host.
UNMEASURED = {"forward": "sdpa", "decode": "triton", "prefill": "triton"}


def _kind(q: torch.Tensor, kv_rows: torch.Tensor | None) -> str:
    if kv_rows is None:
        return "forward"
    return "decode" if q.shape[2] == 1 else "prefill"


def _key(q, k, kv_rows, window: int, sinks, wants_grad: bool) -> tuple:
    """The call's shape as the choice sees it: exact where a run's calls repeat (decode
    batches, the cache's length), rounded up to a power of two where they vary (rows and
    tokens of a forward, a prefill chunk's queries)."""
    kind = _kind(q, kv_rows)
    batch, heads, num_q, head_dim = q.shape
    if kind != "decode":
        batch, num_q = triton.next_power_of_2(batch), triton.next_power_of_2(num_q)
    static = fast.shapes_are_static(q.device)
    return (kind, batch, num_q, heads, k.shape[1], k.shape[2], head_dim, q.dtype, str(q.device),
            window > 0, sinks is not None, wants_grad, static)  # fmt: skip


def candidates(q: torch.Tensor, kv_rows: torch.Tensor | None) -> list[str]:
    """The forms that can run this call here (flash-attn-4 where it is installed and the
    GPU, dtype and head dim suit it; zkl's Triton forms only over the cache)."""
    names = ["sdpa"]
    if fa4.usable(q.shape[-1], q.dtype, q.device):
        names.append("flash-attn-4")
    if kv_rows is not None:
        names.append("triton")
    return names


def _time(call: Callable[[], object]) -> float:
    """Median seconds of `call` over TIMED_CALLS calls after one untimed (CUDA events)."""
    call()
    times = []
    for _ in range(TIMED_CALLS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _measure(names: list[str], args: tuple, kwargs: dict, wants_grad: bool) -> str:
    """The fastest of `names` on these inputs; a form that raises is no candidate."""
    q, k, v, *rest = args
    if wants_grad:  # the train forward: what the update pays, forward and backward
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    times = {}
    for name in names:
        form = FORMS[name]

        def call(form=form) -> None:
            out = form(q, k, v, *rest, **kwargs)
            if wants_grad:
                out.sum().backward()

        try:
            times[name] = _time(call)
        except Exception:  # a shape or option this form refuses
            continue
    return min(times, key=times.get)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """`zkl.ops.attention` by the fastest form measured for this call's shape."""
    wants_grad = torch.is_grad_enabled() and (
        q.requires_grad or (sinks is not None and sinks.requires_grad)
    )
    key = _key(q, k, kv_rows, window, sinks, wants_grad)
    name = _CHOSEN.get(key)
    kwargs = {"window": window, "sinks": sinks}
    if name is None:
        # Triton's interpreter (CPU tensors) times nothing; a capture may not
        if not q.is_cuda or torch.cuda.is_current_stream_capturing():
            name = UNMEASURED[key[0]]
        else:
            names = candidates(q, kv_rows)
            args = (q, k, v, q_pos, kv_rows)
            name = names[0] if len(names) == 1 else _measure(names, args, kwargs, wants_grad)
            _CHOSEN[key] = name
    return FORMS[name](q, k, v, q_pos, kv_rows, **kwargs)


def chosen() -> dict[tuple[str, int, int, int, bool], str]:
    """Which form each measured shape runs: (kind, batch, queries, key buffer, with a
    gradient) -> its name, batch and queries rounded as `_key` rounds them."""
    out = {}
    for key, name in _CHOSEN.items():
        kind, batch, num_q, _, _, keys, *_rest, wants_grad, _static = key
        out[kind, batch, num_q, keys, wants_grad] = name
    return out

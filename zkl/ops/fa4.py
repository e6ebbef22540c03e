"""flash-attn-4 behind zkl's attention signature: zero mode's attention on Hopper and newer.

With one split over the keys (`num_splits=1`) flash-attn-4 walks a query's keys in the same
fixed key tiles, counted from position 0, whether the query is one row of a causal prefill,
a chunk of a prompt read from the cache, or a lone decode query; a key tile a query does not
see leaves its state untouched, and a row's reductions never read another row. So a query's
output bits follow its position and its keys alone (docs/design.md section 3), the contract
zkl's Triton kernels keep, at flash-attn-4's speed. `serves` decides once per head dim, dtype
and device whether this device keeps that contract: the kernels run a probe of every query,
prefill against decode from the cache, and flash-attn-4 serves only where all agree.

Calls map onto flash-attn-4 as follows (zkl: q [B, H, Tq, D], k/v [R, Hkv, Tk, D], key j at
position j; flash-attn-4: [B, T, H, D] views, no copy):
- the train path and scoring (no `kv_rows`; positions 0..T-1; the keys are the queries'
  own): `flash_attn_func`, causal, with its deterministic backward;
- the scheduler (`kv_rows`, the cache slot of each batch row): `flash_attn_varlen_func` over
  the whole cache, one page a slot (`page_table` = the slots). A row's queries count while
  their positions follow its first one by one (`seqused_q`; a padded prefill row may repeat
  the cache's last position for its pads), and `seqused_k` = the first position + that
  count, so query i sees the keys up to its own position (flash-attn-4 aligns the used
  queries to the end of the used keys). The pads after them get zeros.
A window W (keys p-W+1..p) is `window_size=(W - 1, 0)`; sinks are `learnable_sink`.
"""

from __future__ import annotations

import functools
import importlib
import warnings

import torch

DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def _module():
    """flash-attn-4's interface, or None where it is not installed (an optional extra)."""
    try:
        return importlib.import_module("flash_attn.cute")
    except Exception:  # an absent or broken install: zkl's Triton kernels serve
        return None


def _window(window: int) -> tuple[int | None, int | None]:
    return (window - 1, 0) if window else (None, None)


def _out(result) -> torch.Tensor:
    """flash-attn-4 returns `(out, lse)`; zkl wants `out`."""
    return result[0] if isinstance(result, tuple) else result


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    kv_rows: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    num_splits: int = 1,
) -> torch.Tensor:
    """`zkl.ops.attention` through flash-attn-4: q [B, H, Tq, D] -> [B, H, Tq, D].

    Without `kv_rows` the keys are the queries' own at positions 0..T-1 (the train path and
    scoring); with them, `k`/`v` are the cache [S, Hkv, L, D] and batch row b reads slot
    `kv_rows[b]`, its queries at positions `q_pos[b]` that follow its first one by one (a
    padded row's pads after them may repeat a position: their outputs are zeros).
    """
    fa4 = _module()
    common = {
        "causal": True,
        "window_size": _window(window),
        "learnable_sink": sinks,
        "num_splits": num_splits,
    }
    qt = q.transpose(1, 2)  # [B, Tq, H, D]
    if kv_rows is None:
        if q.shape[2] != k.shape[2]:
            raise ValueError("attention without cache rows needs the queries' own keys")
        out = fa4.flash_attn_func(
            qt, k.transpose(1, 2), v.transpose(1, 2), deterministic=True, **common
        )
        return _out(out).transpose(1, 2)
    pages = kv_rows.to(torch.int32).view(-1, 1)  # one page a slot: the whole row
    steps = torch.arange(q.shape[2], device=q.device)
    follows = q_pos == q_pos[:, :1] + steps  # [B, Tq]
    run = follows.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int32)  # [B]
    out = _out(
        fa4.flash_attn_varlen_func(
            qt,
            k.transpose(1, 2),  # [S, L, Hkv, D]: S pages of L keys
            v.transpose(1, 2),
            seqused_q=run,
            seqused_k=(q_pos[:, 0] + run).to(torch.int32),
            page_table=pages,
            **common,
        )
    )
    if q.shape[2] > 1:  # the pads' rows were not computed
        out = out.masked_fill((steps >= run[:, None])[:, :, None, None], 0.0)
    return out.transpose(1, 2)


def usable(head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """What flash-attn-4 takes at all: installed, a Hopper or newer GPU, 16-bit inputs, a head
    dim of 8..256 in steps of 8."""
    if device.type != "cuda" or dtype not in DTYPES or _module() is None:
        return False
    if not (8 <= head_dim <= 256 and head_dim % 8 == 0):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def own_splits(device: torch.device) -> int:
    """The split count a fast generator leaves to flash-attn-4: its heuristic (0) where the
    device splits the keys, one on Hopper, where flash-attn-4 refuses a split."""
    return 0 if torch.cuda.get_device_capability(device)[0] >= 10 else 1


_SERVES: dict[tuple, bool] = {}


def serves(head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether flash-attn-4 is zero mode's attention for this head dim and dtype on `device`.

    Decided once (never while a CUDA graph is captured: Triton serves that call, and the
    graph warm-up before it has decided) by `probe`, for windows and sinks alike. A call
    pattern flash-attn-4 refuses, or a single differing bit, keeps zkl's Triton kernels.
    """
    key = (head_dim, dtype, str(device))
    if key in _SERVES:
        return _SERVES[key]
    if not usable(head_dim, dtype, device):
        _SERVES[key] = False
        return False
    if torch.cuda.is_current_stream_capturing():
        return False
    try:
        agree, why = probe(head_dim, dtype, device), "its prefill and decode differ"
    except Exception as error:  # a refused shape or a failed compile
        agree, why = False, f"it failed: {error}"
    if not agree:
        warnings.warn(
            f"attention: flash-attn-4 does not serve head dim {head_dim} {dtype} on this "
            f"device ({why}); zkl's Triton kernels do",
            stacklevel=2,
        )
    _SERVES[key] = agree
    return agree


def probe(head_dim: int, dtype: torch.dtype, device: torch.device, seq: int = 700) -> bool:
    """Every query of a seeded causal prefill against the same query decoded alone from a
    cache slot, and a prompt chunk at an offset against the same rows of the prefill, with
    no window and with a window and sinks: all bit for bit."""
    g = torch.Generator(device="cpu").manual_seed(11)
    heads, kv_heads = 6, 2
    q = torch.randn(1, seq, heads, head_dim, generator=g).to(device, dtype).transpose(1, 2)
    k, v = (torch.randn(1, kv_heads, seq, head_dim, generator=g).to(device, dtype) for _ in "kv")
    sinks = torch.randn(heads, generator=g).to(device)
    positions = torch.arange(seq, device=device)
    cache_k = torch.zeros(3, kv_heads, seq + 64, head_dim, device=device, dtype=dtype)
    cache_v = torch.zeros_like(cache_k)
    cache_k[2, :, :seq], cache_v[2, :, :seq] = k[0], v[0]
    slot = torch.full((seq,), 2, device=device)
    q_dec = q[0].transpose(0, 1).unsqueeze(2)  # [seq, H, 1, D]: every query its own row
    for window, sink in ((0, None), (200, sinks)):
        whole = attention(q, k, v, positions[None], window=window, sinks=sink)
        one = attention(q_dec, cache_k, cache_v, positions[:, None], slot, window, sink)
        if not torch.equal(one[:, :, 0], whole[0].transpose(0, 1)):
            return False
        lo = 333
        chunk = attention(
            q[:, :, lo:], cache_k, cache_v, positions[None, lo:], slot[:1], window, sink
        )
        if not torch.equal(chunk, whole[:, :, lo:]):
            return False
    return True

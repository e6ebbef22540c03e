"""Attention rows of the CUDA bench: zero mode's attention against PyTorch's flash (SDPA).

"zkl" is what zero mode runs (`zkl.ops.cuda.attention`: flash-attn-4 where it serves this
device, else zkl's Triton kernels); the Triton kernels' own rows stand beside it ("triton"),
and the default path's ("default": the fastest form measured for the shape,
`zkl.ops.fastest_attention`, named in its `default_form` row).

Shapes are the Qwen2.5-1.5B layer's (12 query heads, 2 KV heads, head dim 128, bf16):
- the scoring forward, and forward + backward, at T = 2k, 8k, 16k (about 16k tokens a call);
- decode (one query a row over its whole context) at batch 1, 16, 64, contexts 2k, 8k, 32k.
SDPA's baseline is the faster of its two GQA forms (`enable_gqa`, or the KV heads repeated
outside the timing), so the ratio is against the fastest thing PyTorch offers. Decode calls
are timed from CUDA graphs (they run in microseconds); the rest with CUDA events.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from zkl import invariance
from zkl.lab.timing import cuda_time, graph_time
from zkl.ops import cuda, fa4, fastest_attention
from zkl.ops.triton import attention as attn

HEADS, KV_HEADS, HEAD_DIM = 12, 2, 128
SEQS = (2048, 8192, 16384)
CONTEXTS = (2048, 8192, 32768)
DECODE_BATCHES = (1, 16, 64)
TOKENS_PER_CALL = 16384
TILE_SEQS = (8192,)


def _sdpa_forms(q, k, v, causal: bool) -> dict[str, Callable[[], torch.Tensor]]:
    groups = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return {
        "gqa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True),
        "repeat": lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=causal),
    }


def _fastest(forms: dict[str, Callable[[], object]], timer) -> tuple[str, float]:
    times = {}
    for name, fn in forms.items():
        try:
            times[name] = timer(fn)
        except RuntimeError as exc:  # a form this build cannot run is no baseline
            print(f"zkl.bench: SDPA {name} failed: {exc!r}")
    best = min(times, key=times.get)
    return best, times[best]


def _qkv(batch: int, seq: int, grad: bool = False, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, seq, HEADS, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16)
    q = q.transpose(1, 2)  # the model's layout: [B, H, T, D] over [B, T, H, D] memory
    k, v = (
        torch.randn(batch, KV_HEADS, seq, HEAD_DIM, device="cuda", generator=g).bfloat16()
        for _ in range(2)
    )
    if grad:
        q, k, v = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    return q, k, v


def _form(q: torch.Tensor) -> str:
    """Which attention zero mode runs for q's head dim and dtype here."""
    return "flash-attn-4" if fa4.serves(q.shape[-1], q.dtype, q.device) else "triton"


def _default_form(kind: str, batch: int, num_q: int, keys: int, grad: bool = False) -> str:
    """The form the default path measured fastest for this row's shape."""
    return fastest_attention.chosen().get((kind, batch, num_q, keys, grad), "unmeasured")


def forward_rows(seqs: tuple[int, ...] = SEQS) -> dict[str, object]:
    out: dict[str, object] = {}
    zero = frozenset(invariance.FIXES)
    for seq in seqs:
        batch = max(1, TOKENS_PER_CALL // seq)
        q, k, v = _qkv(batch, seq)
        pos = torch.arange(seq, device="cuda").expand(batch, seq)
        with invariance.enabled(zero), torch.no_grad():
            choice = attn.choose(HEAD_DIM, q.dtype, q.device)
            tile = choice.prefill
            zkl_s = cuda_time(lambda q=q, k=k, v=v, p=pos: cuda.attention(q, k, v, p), repeats=10)
            triton_s = cuda_time(
                lambda q=q, k=k, v=v, p=pos: attn.attention(q, k, v, p), repeats=10
            )
        with torch.no_grad():
            default_s = cuda_time(
                lambda q=q, k=k, v=v, p=pos: cuda.attention_default(q, k, v, p), repeats=10
            )
        with invariance.enabled(zero), torch.no_grad():
            name, sdpa_s = _fastest(
                _sdpa_forms(q.contiguous(), k, v, True), lambda f: cuda_time(f, repeats=10)
            )
        flops = 4 * batch * HEADS * HEAD_DIM * seq * seq / 2
        key = f"attn/fwd/T{seq}"
        out[f"{key}/form"] = _form(q)
        out[f"{key}/triton_tile"] = (
            f"{tile.rows}x{attn.KEY_BLOCK} w{tile.warps} s{tile.stages}, "
            f"decode {choice.decode_rows} rows, chunk {attn.CHUNK}"
        )
        out[f"{key}/zkl_tflops"] = flops / zkl_s / 1e12
        out[f"{key}/sdpa_tflops"] = flops / sdpa_s / 1e12
        out[f"{key}/sdpa_form"] = name
        out[f"{key}/zkl_over_sdpa_speed"] = sdpa_s / zkl_s
        out[f"{key}/triton_over_sdpa_speed"] = sdpa_s / triton_s
        out[f"{key}/default_over_sdpa_speed"] = sdpa_s / default_s
        out[f"{key}/default_form"] = _default_form("forward", batch, seq, seq)
        if seq in TILE_SEQS:  # every candidate tile, whatever its bits: the data for choosing
            for cand in attn.PREFILL_TILES:
                name_t = f"{cand.rows}w{cand.warps}{'n' if cand.nested else 'f'}"
                name_t += "c" if cand.fp_fusion else ""
                with torch.no_grad():
                    t_s = cuda_time(
                        lambda c=cand, a=(q, k, v, pos): attn.prefill(*a, tile=c), repeats=5
                    )
                out[f"{key}/candidate_{name_t}_over_sdpa_speed"] = sdpa_s / t_s

        qg, kg, vg = _qkv(batch, seq, grad=True)

        def zkl_step(qg=qg, kg=kg, vg=vg, pos=pos) -> None:
            cuda.attention(qg, kg, vg, pos).sum().backward()

        forms = {
            name: (lambda f=f: f().sum().backward())
            for name, f in _sdpa_forms(qg, kg, vg, True).items()
        }

        def default_step(qg=qg, kg=kg, vg=vg, pos=pos) -> None:
            cuda.attention_default(qg, kg, vg, pos).sum().backward()

        zkl_s = cuda_time(zkl_step, repeats=5)
        default_s = cuda_time(default_step, repeats=5)
        name, sdpa_s = _fastest(forms, lambda f: cuda_time(f, repeats=5))
        out[f"attn/fwd_bwd/T{seq}/zkl_over_sdpa_speed"] = sdpa_s / zkl_s
        out[f"attn/fwd_bwd/T{seq}/default_over_sdpa_speed"] = sdpa_s / default_s
        form = _default_form("forward", batch, seq, seq, grad=True)
        out[f"attn/fwd_bwd/T{seq}/default_form"] = form
        out[f"attn/fwd_bwd/T{seq}/sdpa_form"] = name
        torch.cuda.empty_cache()
    return out


def decode_rows(
    contexts: tuple[int, ...] = CONTEXTS, batches: tuple[int, ...] = DECODE_BATCHES
) -> dict[str, object]:
    out: dict[str, object] = {}
    for ctx in contexts:
        for batch in batches:
            g = torch.Generator(device="cuda").manual_seed(ctx + batch)
            q = torch.randn(batch, 1, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
            q = q.transpose(1, 2)
            cache = [
                torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device="cuda", generator=g).bfloat16()
                for _ in range(2)
            ]
            pos = torch.full((batch, 1), ctx - 1, device="cuda")
            rows = torch.arange(batch, device="cuda")
            key = f"attn/decode/b{batch}/ctx{ctx}"
            zero = cuda.attention(q, cache[0], cache[1], pos, rows)
            args = (q, cache[0], cache[1], pos, rows)
            zkl_s = graph_time(lambda args=args: cuda.attention(*args))
            triton_s = graph_time(lambda args=args: attn.attention(*args))
            default_s = graph_time(lambda args=args: cuda.attention_default(*args))
            qc = q.contiguous()
            name, sdpa_s = _fastest(_sdpa_forms(qc, *cache, False), graph_time)
            kv_bytes = 2 * cache[0].numel() * cache[0].element_size()
            out[f"{key}/zkl_us"] = 1e6 * zkl_s
            out[f"{key}/zkl_tb_s"] = kv_bytes / zkl_s / 1e12
            out[f"{key}/sdpa_us"] = 1e6 * sdpa_s
            out[f"{key}/sdpa_form"] = name
            out[f"{key}/zkl_over_sdpa_speed"] = sdpa_s / zkl_s
            out[f"{key}/triton_over_sdpa_speed"] = sdpa_s / triton_s
            out[f"{key}/default_over_sdpa_speed"] = sdpa_s / default_s
            out[f"{key}/default_form"] = _default_form("decode", batch, 1, ctx)
            reference = F.scaled_dot_product_attention(
                qc, *cache, enable_gqa=True
            )  # the same maths, another order: close, not equal
            out[f"{key}/max_abs_vs_sdpa"] = (zero.float() - reference.float()).abs().max().item()
            torch.cuda.empty_cache()
    return out

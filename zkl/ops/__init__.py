"""The kernels every engine path calls; each picks its form by device and named fix.

Per fix: off -> `fast` (what a default engine runs on any device); on -> the invariant form
of the tensor's device: `invariant` (CPU reference, the spec) or `cuda` (Triton kernels).
No model or engine code branches on the device.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from zkl.invariance import is_enabled
from zkl.ops import fast, invariant


def _invariant_for(t: torch.Tensor) -> ModuleType:
    if t.is_cuda:
        return importlib.import_module("zkl.ops.cuda")
    return invariant


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    impl = _invariant_for(x) if is_enabled("batch_invariant_gemm") else fast
    return impl.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    impl = _invariant_for(x) if is_enabled("batch_invariant_reductions") else fast
    return impl.rms_norm(x, weight, eps)


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
) -> torch.Tensor:
    """Causal attention: q [B, H, Tq, D], k/v [R, Hkv, Tk, D] (key j at position j).

    q_pos [B, Tq] are the queries' absolute positions; batch row b reads the keys of row
    `kv_rows[b]` (the KV-cache slot; default b).
    """
    impl = _invariant_for(q) if is_enabled("attention_fixed_split") else fast
    return impl.attention(q, k, v, q_pos, kv_rows)


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


def gumbel_argmax(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Gumbel-max sampling: first argmax of scores [B, V] + `zkl.rng.gumbel(keys [B], V)`.

    Not a fix (every mode samples this way, and a row's draw never reads another row): on
    CUDA one fused Triton pass replaces the noise's forty int64 passes over [B, V].
    """
    if scores.is_cuda:
        return importlib.import_module("zkl.ops.cuda").gumbel_argmax(scores, keys)
    return fast.gumbel_argmax(scores, keys)

"""The kernels every engine path calls; each picks its invariant or fast form by named fix."""

from __future__ import annotations

import torch

from zkl.invariance import is_enabled
from zkl.ops import fast, invariant


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    impl = invariant if is_enabled("batch_invariant_gemm") else fast
    return impl.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    impl = invariant if is_enabled("batch_invariant_reductions") else fast
    return impl.rms_norm(x, weight, eps)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor
) -> torch.Tensor:
    """Causal attention: q [B, H, Tq, D], k/v [B, Hkv, Tk, D] (key j at position j).

    q_pos [B, Tq] are the queries' absolute positions.
    """
    impl = invariant if is_enabled("attention_fixed_split") else fast
    return impl.attention(q, k, v, q_pos)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """The one logprob path: fp32 log-softmax of raw `logits / temperature`, gathered at tokens.

    logits [..., V], tokens [...] -> fp32 [...]; a tensor temperature broadcasts as [..., 1]
    (fp32, so it divides exactly as the same Python float would). The trainer always uses
    it; the generator does when `logprob_path` is on.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

"""The kernels every engine path calls, each chosen by one rule from a table of forms.

`TABLE` maps each op to the named fix that governs it and to its four forms: CPU fast, CPU
invariant, CUDA fast, CUDA invariant. `dispatch(op, cuda)` is the one rule: the CUDA forms
for a CUDA tensor and the PyTorch forms for any other, the invariant one exactly when the
op's fix is on (`zkl.invariance.is_enabled`). The fast forms are what a fast generator runs
(`fast`, cuBLAS, flash attention); the invariant ones are `invariant` (the CPU reference,
the spec) and `cuda` (Triton). An op no fix governs has one form per device, written in
both of its cells. No model or engine code branches on the device.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from zkl.invariance import FIXES, is_enabled
from zkl.ops import fast, invariant, ssd


class _Cuda:
    """The CUDA form `zkl.ops.cuda.<name>`, imported at its call: Triton is an optional
    dependency the CPU path never needs."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        return getattr(importlib.import_module("zkl.ops.cuda"), self.name)(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Cuda) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("zkl.ops.cuda", self.name))

    def __repr__(self) -> str:
        return f"zkl.ops.cuda.{self.name}"


@dataclass(frozen=True)
class Op:
    """One op's four forms and the fix that picks between each device's fast and invariant.

    `fix` None: no fix governs the op, and each device's two cells hold its one form.
    """

    fix: str | None
    cpu_fast: Callable
    cpu_invariant: Callable
    cuda_fast: Callable
    cuda_invariant: Callable

    def __post_init__(self):
        assert self.fix is None or self.fix in FIXES, f"unknown fix {self.fix!r}"
        assert self.fix is not None or (
            self.cpu_fast == self.cpu_invariant and self.cuda_fast == self.cuda_invariant
        ), "an op no fix governs has one form per device"

    def form(self, cuda: bool, invariant: bool) -> Callable:
        """The cell of (CUDA or the CPU's PyTorch, fast or invariant)."""
        if cuda:
            return self.cuda_invariant if invariant else self.cuda_fast
        return self.cpu_invariant if invariant else self.cpu_fast


GEMM, REDUCTIONS = "batch_invariant_gemm", "batch_invariant_reductions"

TABLE: dict[str, Op] = {
    "linear": Op(
        GEMM,
        cpu_fast=fast.linear,
        cpu_invariant=invariant.linear,
        cuda_fast=fast.linear,  # F.linear: cuBLAS picks the kernel and split-K by M
        cuda_invariant=_Cuda("linear"),
    ),
    "grouped_linear": Op(
        GEMM,
        cpu_fast=fast.grouped_linear,
        cpu_invariant=invariant.grouped_linear,
        cuda_fast=_Cuda("grouped_linear_default"),
        cuda_invariant=_Cuda("grouped_linear"),
    ),
    "rms_norm": Op(
        REDUCTIONS,
        cpu_fast=fast.rms_norm,
        cpu_invariant=invariant.rms_norm,
        cuda_fast=_Cuda("rms_norm_default"),  # one fused pass a row, as fast generators run it
        cuda_invariant=_Cuda("rms_norm"),
    ),
    "add_rms_norm": Op(
        REDUCTIONS,
        cpu_fast=fast.add_rms_norm,
        cpu_invariant=invariant.add_rms_norm,
        cuda_fast=_Cuda("add_rms_norm_default"),  # the residual add fused into the norm
        cuda_invariant=_Cuda("add_rms_norm"),
    ),
    "softmax": Op(
        REDUCTIONS,
        cpu_fast=fast.softmax,
        # torch's fp32 softmax is row-invariant on the CPU (measured, docs/design.md section 4)
        cpu_invariant=fast.softmax,
        cuda_fast=fast.softmax,
        cuda_invariant=_Cuda("softmax"),
    ),
    "token_logprobs": Op(
        REDUCTIONS,
        cpu_fast=fast.token_logprobs,
        # torch's log_softmax is row-invariant on the CPU (measured, docs/design.md section 4)
        cpu_invariant=fast.token_logprobs,
        cuda_fast=fast.token_logprobs,
        cuda_invariant=_Cuda("token_logprobs"),
    ),
    "attention": Op(
        "attention_fixed_split",
        cpu_fast=fast.attention,  # SDPA
        cpu_invariant=invariant.attention,
        cuda_fast=_Cuda("attention_default"),  # the fastest measured: SDPA, flash-attn-4, Triton
        cuda_invariant=_Cuda("attention"),
    ),
    # No fix governs the rest: each device's one form serves every mode (CUDA's fused passes
    # give the torch forms' bits, or are the only form both paths run).
    "rotary": Op(
        None,
        cpu_fast=fast.rotary,
        cpu_invariant=fast.rotary,
        cuda_fast=_Cuda("rotary"),
        cuda_invariant=_Cuda("rotary"),
    ),
    "rotary_into_cache": Op(
        None,
        cpu_fast=fast.rotary_into_cache,
        cpu_invariant=fast.rotary_into_cache,
        cuda_fast=_Cuda("rotary_into_cache"),
        cuda_invariant=_Cuda("rotary_into_cache"),
    ),
    "silu_mul": Op(
        None,
        cpu_fast=fast.silu_mul,
        cpu_invariant=fast.silu_mul,
        cuda_fast=_Cuda("silu_mul"),
        cuda_invariant=_Cuda("silu_mul"),
    ),
    "gumbel_argmax": Op(
        None,
        cpu_fast=fast.gumbel_argmax,
        cpu_invariant=fast.gumbel_argmax,
        cuda_fast=_Cuda("gumbel_argmax"),
        cuda_invariant=_Cuda("gumbel_argmax"),
    ),
    "commit_samples": Op(
        None,
        cpu_fast=fast.commit_samples,
        cpu_invariant=fast.commit_samples,
        cuda_fast=_Cuda("commit_samples"),
        cuda_invariant=_Cuda("commit_samples"),
    ),
    "ssd_commit_rows_": Op(
        None,
        cpu_fast=ssd.commit_rows_,
        cpu_invariant=ssd.commit_rows_,
        cuda_fast=_Cuda("ssd_commit_rows_"),
        cuda_invariant=_Cuda("ssd_commit_rows_"),
    ),
}


def dispatch(op: str, cuda: bool) -> Callable:
    """The one rule: op's form for its tensors' device (`cuda`: on a CUDA device; any other
    runs the PyTorch forms), its invariant form exactly when its fix is on.

    The wrappers below pass `tensor.is_cuda`: reading `tensor.device` would cost each call a
    device object.
    """
    return TABLE[op].form(cuda, runs_invariant(op))


def runs_invariant(op: str) -> bool:
    """Whether `op` takes its invariant form now: its fix is on. A framework's slot whose fast
    form is the framework's own module (megatron's linears, norm and attention) asks this,
    so its choice is the table's rule too."""
    fix = TABLE[op].fix
    return fix is not None and is_enabled(fix)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T + bias -> [..., N]."""
    return dispatch("linear", x.is_cuda)(x, weight, bias)


def grouped_linear(
    x: torch.Tensor, weights: Sequence[torch.Tensor], offsets: torch.Tensor
) -> torch.Tensor:
    """The MoE experts' GEMMs: x [M, K] with rows grouped at offsets [E + 1] (x's device) ->
    [M, N], group e @ weights[e].T (each [N, K], no bias).

    With `batch_invariant_gemm` each row equals the dense `linear`'s row of its expert,
    whatever the other groups hold. On CUDA one launch reads the offsets on the device (no
    host sync: a CUDA graph can hold it); the CPU loops over the groups on the host.
    """
    return dispatch("grouped_linear", x.is_cuda)(x, weights, offsets)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in fp32, rounded to x's dtype."""
    return dispatch("rms_norm", x.is_cuda)(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta, weight)): the residual stream and the next layer's input.

    The invariant CUDA form is one fused pass where no gradient is wanted (its bits are the
    add's then the norm's); every other form is the add, then `rms_norm`'s form.
    """
    return dispatch("add_rms_norm", x.is_cuda)(x, delta, weight, eps)


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE of q [B, T, Hq, D] and k [B, T, Hkv, D] at positions [B, T]: new [B, T, H, D].

    On CUDA without gradients one fused pass gives the torch form's bits.
    """
    return dispatch("rotary", q.is_cuda)(q, k, cos, sin, positions)


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
    form = dispatch("rotary_into_cache", q.is_cuda)
    return form(q, k, v, cos, sin, positions, cache_k, cache_v, slots)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up. On CUDA every path runs the one fused Triton pass (its exponential
    is Triton's), so the train and gen paths share it in every mode."""
    return dispatch("silu_mul", gate.is_cuda)(gate, up)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """fp32 softmax over the last dim (the MoE router); invariant with the reductions fix."""
    return dispatch("softmax", x.is_cuda)(x)


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
    p sees only the keys p-W+1..p; `sinks` [H] (gpt-oss): one more logit per head in the
    softmax's denominator, with no value. An option of the attention is a keyword that every
    one of its four forms takes.
    """
    return dispatch("attention", q.is_cuda)(q, k, v, q_pos, kv_rows, window=window, sinks=sinks)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """The one logprob path: fp32 log-softmax of raw `logits / temperature`, gathered at tokens.

    logits [..., V], tokens [...] -> fp32 [...]; a tensor temperature broadcasts as [..., 1]
    (fp32, so it divides exactly as the same Python float would). The trainer always uses
    it; the generator does when `logprob_path` is on. Its vocab reduction is invariant with
    `batch_invariant_reductions` (CPU: torch's, measured row-invariant; CUDA: Triton).
    """
    return dispatch("token_logprobs", logits.is_cuda)(logits, tokens, temperature)


def commit_samples(
    state, rows: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor, eos_id: int | None
) -> None:
    """The decode step's bookkeeping, in place on the scheduler's slot state (`SlotState`):
    tokens [B] and logprobs [B] of the slots `rows` [B] into their outputs; count, position,
    next input and done flag updated; finished rows untouched. On CUDA one launch instead of
    some thirty (integer and copy work: the same bits)."""
    dispatch("commit_samples", rows.is_cuda)(state, rows, tokens, logprobs, eos_id)


def gumbel_argmax(
    scores: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gumbel-max sampling: first argmax of scores [B, V] (divided by `temperature` [B] in
    fp32 when given) + `zkl.rng.gumbel(zkl.rng.key(seeds, counters), V)`.

    Every mode samples this way, and a row's draw never reads another row: on CUDA one
    fused Triton pass replaces the noise's forty int64 passes over [B, V], the key's hundred
    tiny kernels and the temperature's fp32 copy of the logits.
    """
    return dispatch("gumbel_argmax", scores.is_cuda)(scores, seeds, counters, temperature)


def ssd_commit_rows_(
    state: torch.Tensor,
    slots: torch.Tensor,
    full: torch.Tensor,
    B: torch.Tensor,
    cum: torch.Tensor,
    xdt: torch.Tensor,
) -> None:
    """The Mamba-2 chunk commit in place: state[slots[r]] [S, H, P, N] fp32 moved to the end
    of row r's chunk, for the rows r where full[r] (`zkl.ops.ssd.commit`'s arithmetic). On
    CUDA the kernel reads the flags on the device, so a CUDA graph can hold the step."""
    dispatch("ssd_commit_rows_", state.is_cuda)(state, slots, full, B, cum, xdt)

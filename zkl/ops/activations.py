"""Activations whose bits never depend on an element's place in its tensor, on every device.

On the CPU torch's own `sigmoid`, `silu`, `softplus` and `gelu` run a vector loop whose
scalar tail rounds differently from its lanes, and which elements fall in the tail depends
on the tensor's size and where a thread's share of it starts. So the same value gives other
bits in a decode step (a few rows) than in scoring (many): measured on an AVX-512 CPU with
torch 2.13, `sigmoid` on the MoE's [pairs, 40] activations broke gpt-oss's prefill == decode
== scoring in fp32, and `silu` on [rows, 1000] gate rows did so for Llama and Qwen on two
threads. `exp` and `log` apply the vector form to every element (a partial load for the
tail), and `+`, `*`, `/` are correctly rounded in either form, so the activations here are
built from those alone. CUDA's elementwise kernels have no such split; the same forms run
there so that every path, on every device, computes one formula.

Each computes in fp32 (fp64 stays fp64) and rounds once to the input's dtype, as torch's
own kernels do for bf16 and fp16.
"""

from __future__ import annotations

import torch


def _opmath(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below: the exponent is -|x|, so it never
    overflows and the gradient stays finite far below zero (where 1 / (1 + e^-x) gives
    inf * 0 = NaN in the backward)."""
    positive = x >= 0
    e = torch.exp(torch.where(positive, -x, x))  # e^-|x| in (0, 1]; d/dx right at 0 too
    denom = 1.0 + e
    return torch.where(positive, 1.0 / denom, e / denom)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """Logistic sigmoid, rounded once to x's dtype."""
    return _sigmoid(_opmath(x)).to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), rounded once to x's dtype."""
    xf = _opmath(x)
    return (xf * _sigmoid(xf)).to(x.dtype)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(x)), x itself above 20 (as torch's), rounded once to x's dtype."""
    xf = _opmath(x)
    soft = torch.log(1.0 + torch.exp(torch.clamp(xf, max=20.0)))
    return torch.where(xf > 20.0, xf, soft).to(x.dtype)

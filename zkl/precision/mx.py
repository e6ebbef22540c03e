"""Rowwise MXFP8 quantization, bit for bit as NVIDIA Transformer Engine does it, in plain PyTorch.

OCP MX layout: blocks of 32 consecutive elements along the last dim, one E8M0 scale (a biased
power-of-two exponent byte) per block, E4M3 elements. The scale rule is TE's, not the OCP
spec's floor rule. Each step below follows TE (v2.13 or later; read at commit d0067d0d):

- amax: max |x| over the block, NaN ignored (fmaxf / max.abs, starting from 0), in
  transformer_engine/common/cast/mxfp8/quantize_mxfp8.cuh.
- scale byte: `float_to_e8m0(amax * max_norm_rcp)` with `max_norm_rcp` = fp32(1/448),
  transformer_engine/common/util/ptx_arch_spec.cuh (`cvt.rp.satfinite.ue8m0x2.f32` on
  Blackwell; this module follows the software path beside it, which TE's C++ reference test
  tests/cpp/test_common.h repeats): round the fp32 value up to a power of two. NaN -> 0xFF,
  inf -> 0xFE, 0 -> 0x00; a value above 2^127 would saturate to 0xFE (no finite amax gets
  there: amax / 448 < 2^120); a subnormal value <= 2^-127 gives 0x00 (2^-127), one in
  (2^-127, 2^-126) gives 0x01.
- element: `cvt.rn.satfinite.e4m3x2.f32(x * exp2f_rcp(byte))`, exp2f_rcp in
  transformer_engine/common/util/ptx.cuh: 2^(127 - byte), exact; 2^-127 (subnormal) for 0xFE,
  NaN for 0xFF. Before TE v2.13 (PR #2647) byte 0 gave 1.0 instead of 2^127 (torchao's RCEIL
  still does) and 0xFE gave 0.
  The cast rounds to nearest even, saturates finite overflow and inf to +-448, and turns every
  NaN, whatever its sign, into 0x7F (cuda_fp8.hpp's emulation says so; `e4m3_satfinite` matched
  the instruction on an H200 for 25M fp32 inputs, every bf16 value among them).
- dequantize: `q * exp2f(byte)` in fp32 (2^-127 for byte 0, NaN for 0xFF), the same file.

Batch invariance: every step is elementwise or a max over one 32-element block of one row, and
a max is exact in any order, so a row's result never depends on the other rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_SIZE = 32
E4M3_MAX = 448.0
_MAX_NORM_RCP = torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32)  # fp32(1/448), TE's constant
_E4M3_NAN = 0x7F  # canonical NaN the hardware cast writes, whatever the input NaN's sign


def te_e8m0_scale(amax: torch.Tensor) -> torch.Tensor:
    """Biased E8M0 exponent (uint8) of each block amax, TE's round-up rule.

    Why not OCP's floor(log2(amax)) - 8: TE rounds amax/448 *up* to a power of two, so the
    block maximum never saturates. The product is taken in fp32 with fp32(1/448), as TE does;
    dividing by 448 rounds differently for some fp32 amax values. The sign bit is ignored.
    """
    v = amax.float() * _MAX_NORM_RCP
    bits = v.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    # Round up unless already a power of two, already the top finite byte (satfinite), or a
    # subnormal value at most 2^-127, which byte 0 (= 2^-127) already covers.
    round_up = (mantissa != 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    byte = exponent + round_up.to(torch.int32)
    special = torch.where(mantissa == 0, 0xFE, 0xFF)  # inf -> 0xFE, NaN -> 0xFF
    byte = torch.where(exponent == 0xFF, special, byte)
    return byte.to(torch.uint8)


def _scale_reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """Exact fp32 2^(127 - byte), TE's exp2f_rcp: 2^-127 for 0xFE, NaN for 0xFF."""
    e = scale.to(torch.int32)
    bits = torch.where(e == 0xFE, 0x00400000, (254 - e) << 23)
    bits = torch.where(e == 0xFF, 0x7FFFFFFF, bits)
    return bits.view(torch.float32)


def _scale_value(scale: torch.Tensor) -> torch.Tensor:
    """Exact fp32 2^(byte - 127), TE's exp2f: 2^-127 for 0x00, NaN for 0xFF."""
    e = scale.to(torch.int32)
    bits = torch.where(e == 0, 0x00400000, e << 23)
    bits = torch.where(e == 0xFF, 0x7FFFFFFF, bits)
    return bits.view(torch.float32)


def e4m3_satfinite(y: torch.Tensor) -> torch.Tensor:
    """fp32 -> E4M3 like `cvt.rn.satfinite.e4m3x2.f32`: RNE, clamp to +-448, NaN -> 0x7F.

    The clamp makes saturation explicit instead of relying on the eager cast's overflow rule.
    """
    q = y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    q = torch.where(torch.isnan(y), _E4M3_NAN, q)
    return q.view(torch.float8_e4m3fn)


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [..., K // 32, 32] in fp32; rejects what TE's rowwise MXFP8 cannot take."""
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"MXFP8 quantization takes bfloat16 or float32 input, got {x.dtype}.")
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE:
        raise ValueError(
            f"MXFP8 needs the last dim to be a multiple of {BLOCK_SIZE}, got shape "
            f"{tuple(x.shape)}."
        )
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)


@dataclass(frozen=True)
class MXTensor:
    """MXFP8 data: E4M3 elements (input shape) and one E8M0 byte per 32 along the last dim."""

    data: torch.Tensor  # torch.float8_e4m3fn, same shape as the input
    scale: torch.Tensor  # torch.uint8 biased exponents, shape [..., K // 32]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """`q * 2^(byte - 127)` in fp32 (exact unless it overflows to inf), then cast."""
        q = self.data.float().reshape(*self.scale.shape, BLOCK_SIZE)
        out = q * _scale_value(self.scale).unsqueeze(-1)
        return out.reshape(self.data.shape).to(dtype)


def quantize_mxfp8(x: torch.Tensor) -> MXTensor:
    """Rowwise MXFP8 of a bf16/fp32 tensor with K (last dim) a multiple of 32, as TE does it."""
    blocks = _blocks(x)
    magnitude = blocks.abs()
    amax = torch.where(torch.isnan(magnitude), 0.0, magnitude).amax(-1)  # NaN ignored, as TE
    scale = te_e8m0_scale(amax)
    data = e4m3_satfinite(blocks * _scale_reciprocal(scale).unsqueeze(-1))
    return MXTensor(data=data.reshape(x.shape), scale=scale)


def fake_quantize_mxfp8(x: torch.Tensor) -> torch.Tensor:
    """Quantize then dequantize, in x's dtype.

    For bf16 input the bf16 result is exact: a dequantized value has at most 4 significant bits
    and is a multiple of 2^-133 (the input's grid scaled down and up by the same power of two),
    so bf16 holds it; values past fp32's range are inf in fp32 and bf16 alike.
    """
    return quantize_mxfp8(x).dequantize(x.dtype)

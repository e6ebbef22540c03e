"""MXFP4 weights (OCP MX: blocks of 32 E2M1 values sharing one E8M0 scale), dequantized on load.

gpt-oss checkpoints store each expert matrix as `<name>_blocks` [*prefix, G, 16] uint8 (two
4-bit codes a byte, the low nibble first) and `<name>_scales` [*prefix, G] uint8 (the
exponent, bias 127): the row `prefix` holds G * 32 values, code c meaning E2M1_VALUES[c]
times 2^(scale - 127). Every such product is exact in fp32, so the dequantized weights are
exactly the values the checkpoint encodes. Shapes are checked first, so a bad pair fails in
one sentence before any model is built (the checkpoint check runs this on meta tensors).
"""

from __future__ import annotations

import torch

# E2M1: sign, 2 exponent bits, 1 mantissa bit; codes 8..15 are the negatives of 0..7.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
BLOCK = 32  # values sharing one scale
SCALE_BIAS = 127


def check_pair(name: str, blocks: torch.Tensor | None, scales: torch.Tensor | None) -> None:
    """ValueError in one sentence unless `name`'s blocks and scales form one MXFP4 tensor."""
    if blocks is None or scales is None:
        have, lack = ("blocks", "scales") if scales is None else ("scales", "blocks")
        raise ValueError(
            f"checkpoint tensor {name}_{have} has no {name}_{lack}: an MXFP4 weight needs both."
        )
    if blocks.dim() < 2 or blocks.shape[-1] != BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"checkpoint MXFP4 tensor {name}_blocks has shape {list(blocks.shape)}; with "
            f"{name}_scales {list(scales.shape)} it must be {[*scales.shape, BLOCK // 2]}."
        )
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(
            f"checkpoint MXFP4 tensors {name}_blocks / _scales must be uint8, not "
            f"{blocks.dtype} / {scales.dtype}."
        )


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks [*prefix, G, 16] uint8, scales [*prefix, G] uint8 -> fp32 [*prefix, G * 32]
    (meta tensors give a meta result of that shape)."""
    *prefix, groups, _ = blocks.shape
    if blocks.is_meta:
        return torch.empty(*prefix, groups * BLOCK, device="meta")
    magnitudes = torch.tensor(E2M1_VALUES, device=blocks.device)
    lut = torch.cat([magnitudes, -magnitudes])  # [16]: code -> value
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()  # [..., G, 16, 2]
    values = lut[codes].reshape(*prefix, groups, BLOCK)
    exponents = scales.to(torch.int32) - SCALE_BIAS
    out = torch.ldexp(values, exponents.unsqueeze(-1).float())
    return out.reshape(*prefix, groups * BLOCK)

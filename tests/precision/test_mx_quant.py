"""Rowwise MXFP8 against an independent pure-Python model of TE's rule, bit for bit.

The reference shares no code with zkl.precision.mx: the scale is the smallest power of two at
or above fp32(amax * fp32(1/448)) found with math.frexp (clamped to E8M0's [2^-127, 2^127]),
and an element is the nearest of the 127 finite E4M3 values (ties to the even code), found by
enumerating them. Every bit claim is checked with torch.equal on raw bytes.
"""

from __future__ import annotations

import bisect
import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zkl.precision.fp8_tensor import fake_quantize_fp8_tensor
from zkl.precision.mx import (
    BLOCK_SIZE,
    MXTensor,
    fake_quantize_mxfp8,
    quantize_mxfp8,
    te_e8m0_scale,
)
from zkl.precision.recipes import fake_quantizer

# ---------------------------------------------------------------- independent reference


def _f32(v: float) -> float:
    """Round a Python float (double) to fp32, to nearest even; inf past fp32's range."""
    try:
        return struct.unpack(">f", struct.pack(">f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


_RCP_448 = _f32(1.0 / 448.0)


def ref_scale_byte(amax: float) -> int:
    """E8M0 byte of the smallest power of two >= fp32(amax * fp32(1/448)), within E8M0."""
    v = _f32(amax * _RCP_448)  # exact in double, then one fp32 rounding, as on the GPU
    if math.isnan(v):
        return 0xFF
    if math.isinf(v):
        return 0xFE
    if v == 0.0:
        return 0x00
    mantissa, exponent = math.frexp(v)  # v = mantissa * 2**exponent, 0.5 <= mantissa < 1
    ceil_log2 = exponent - 1 if mantissa == 0.5 else exponent
    return min(max(ceil_log2 + 127, 0), 254)


def _e4m3_value(code: int) -> float:
    exponent, mantissa = code >> 3, code & 7
    if exponent == 0:
        return mantissa * 2.0**-9
    return (1 + mantissa / 8) * 2.0 ** (exponent - 7)


_E4M3_VALUES = [_e4m3_value(code) for code in range(0x7F)]  # all finite magnitudes, ascending
assert sorted(_E4M3_VALUES) == _E4M3_VALUES and _E4M3_VALUES[-1] == 448.0


def ref_e4m3_code(y: float) -> int:
    """Nearest finite E4M3 (ties to even code, so saturating at 448); NaN -> 0x7F."""
    if math.isnan(y):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, y) < 0 else 0
    a = abs(y)
    i = bisect.bisect_left(_E4M3_VALUES, a)  # the nearest value is at i - 1 or i
    candidates = [c for c in (i - 1, i) if 0 <= c < len(_E4M3_VALUES)]
    return sign | min(candidates, key=lambda c: (abs(_E4M3_VALUES[c] - a), c & 1))


def ref_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scale bytes, data bytes, dequantized fp32) of x, one Python loop per block."""
    rows = x.float().reshape(-1, BLOCK_SIZE).tolist()
    scales, codes, values = [], [], []
    for block in rows:
        amax = max((abs(v) for v in block if not math.isnan(v)), default=0.0)
        byte = ref_scale_byte(amax)
        rcp = math.nan if byte == 0xFF else 2.0 ** (127 - byte)
        block_codes = [ref_e4m3_code(v * rcp) for v in block]
        scales.append(byte)
        codes.extend(block_codes)
        for code in block_codes:
            if code & 0x7F == 0x7F or byte == 0xFF:
                values.append(math.nan)
            else:
                sign = -1.0 if code & 0x80 else 1.0
                values.append(_f32(sign * _E4M3_VALUES[code & 0x7F] * 2.0 ** (byte - 127)))
    scale = torch.tensor(scales, dtype=torch.uint8).reshape(*x.shape[:-1], -1)
    data = torch.tensor(codes, dtype=torch.uint8).reshape(x.shape)
    return scale, data, torch.tensor(values, dtype=torch.float32).reshape(x.shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two fp32 tensors, except that any NaN matches any NaN."""
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    return torch.equal(a.view(torch.int32)[~nan], b.view(torch.int32)[~nan])


def assert_matches_reference(x: torch.Tensor) -> None:
    q = quantize_mxfp8(x)
    scale, data, values = ref_quantize(x)
    assert q.data.dtype == torch.float8_e4m3fn and q.data.shape == x.shape
    assert q.scale.dtype == torch.uint8
    assert torch.equal(q.scale, scale)
    assert torch.equal(q.data.view(torch.uint8), data)
    assert same_bits(q.dequantize(), values)


# ---------------------------------------------------------------- adversarial inputs

_GEN = torch.Generator().manual_seed(0)
_SHIFTS = [-157, -150, -140, -133, -128, -127, -126, -125, -120, -60, -10, -1, 0, 1, 10, 60, 119]


def _pow2(k: int) -> torch.Tensor:
    return torch.tensor(2.0**k, dtype=torch.float64).float()


def _block(amax: torch.Tensor) -> torch.Tensor:
    """A block whose |max| is exactly `amax`, other entries amax * u (u in (-1, 1), fp32)."""
    u = torch.rand(BLOCK_SIZE, generator=_GEN) * 2 - 1
    block = amax * u
    block[torch.randint(BLOCK_SIZE, (1,), generator=_GEN)] = -amax if u[0] < 0 else amax
    return block


def _adversarial_amaxes() -> torch.Tensor:
    base = torch.tensor(448.0) * torch.stack([_pow2(k) for k in _SHIFTS])
    base = base[base > 0]
    inf = torch.tensor(math.inf)
    neighbours = torch.cat([base, torch.nextafter(base, inf), torch.nextafter(base, -inf)])
    powers = torch.stack([_pow2(k) for k in range(-149, 128, 7)])
    one_ulp_up = powers * (1 + 2.0**-23)  # mantissa 1 + 2^-23
    finfo = torch.finfo(torch.float32)
    tiny = torch.tensor(
        [2.0**-149, 1e-40, finfo.tiny, 1e-38, 2.6e-36, 448 * 2.0**-127, 5.27e-36, 448 * 2.0**-126]
        + [448 * 2.0**-127 * (1 + 2.0**-22)]
    )
    tiny = torch.cat([tiny, torch.nextafter(tiny, inf), torch.nextafter(tiny, -inf)])
    huge = torch.tensor([finfo.max, 2.0**127, 3e38, 448 * 2.0**119])
    huge = torch.cat([huge, torch.nextafter(huge, -inf)])
    return torch.cat([neighbours, powers, one_ulp_up, tiny, huge])


def adversarial_fp32() -> torch.Tensor:
    """[N, 128] fp32: 4 blocks per row, each block built around one hard amax."""
    blocks = [_block(a) for a in _adversarial_amaxes()]
    blocks.append(torch.zeros(BLOCK_SIZE))
    blocks.append(-torch.zeros(BLOCK_SIZE))
    # Every E4M3 rounding tie (midpoints of the grid, signed), at rcp = 1 and shifted scales.
    grid = torch.tensor(_E4M3_VALUES, dtype=torch.float64)
    mids = ((grid[1:] + grid[:-1]) / 2).float()
    mids = torch.cat([mids, -mids, torch.tensor([448.0, 464.0, -464.0, 480.0, 500.0, -1e4])])
    for k in (-135, -127, -20, 0, 30, 118):
        for chunk in (mids * _pow2(k)).split(BLOCK_SIZE - 1):
            pad = torch.zeros(BLOCK_SIZE - 1 - chunk.numel())
            blocks.append(torch.cat([chunk, pad, torch.tensor([448.0]) * _pow2(k)]))
    blocks += _special_blocks()
    x = torch.stack(blocks)
    x = torch.cat([x, torch.zeros((-len(blocks)) % 4, BLOCK_SIZE)])
    return x.reshape(-1, 4 * BLOCK_SIZE)


def _special_blocks() -> list[torch.Tensor]:
    """Blocks with inf and NaN, mixed with finite values of both signs."""
    nan, inf = math.nan, math.inf
    out = []
    for specials in ([inf], [-inf], [nan], [-nan], [nan, inf], [nan, -inf, 3.0], [inf, -inf]):
        block = _block(torch.tensor(1.5e3))
        block[: len(specials)] = torch.tensor(specials)
        out.append(block)
    out.append(torch.full((BLOCK_SIZE,), nan))
    out.append(torch.tensor([nan, -nan] * (BLOCK_SIZE // 2)))
    huge_block = _block(torch.tensor(3e38))
    huge_block[5] = inf  # scale saturates to 2^127: finite huge values still land on E4M3 codes
    out.append(huge_block)
    return out


def every_bf16() -> torch.Tensor:
    """All 65536 bf16 bit patterns (inf and NaN included)."""
    return torch.arange(-(2**15), 2**15).to(torch.int16).view(torch.bfloat16)


def random_inputs(dtype: torch.dtype) -> torch.Tensor:
    """[64, 256] normal values with one random magnitude per block, 2^-140 .. 2^120."""
    x = torch.randn(64, 256 // BLOCK_SIZE, BLOCK_SIZE, generator=_GEN)
    k = torch.randint(-140, 121, (64, 256 // BLOCK_SIZE, 1), generator=_GEN)
    return (x * torch.exp2(k.float())).reshape(64, 256).to(dtype)


# ---------------------------------------------------------------- 1. reference, bit for bit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adversarial_blocks_match_reference(dtype: torch.dtype) -> None:
    """448*2^k and neighbours, powers of two, 1+2^-23, zero/subnormal/huge amax, E4M3 ties.

    NaN/inf follow TE: NaN is left out of the amax (a NaN-only block scales as all-zero, byte
    0) and quantizes to 0x7F; inf makes the scale byte 0xFE and quantizes to +-448.
    """
    assert_matches_reference(adversarial_fp32().to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_inputs_match_reference(dtype: torch.dtype) -> None:
    assert_matches_reference(random_inputs(dtype))


def test_every_bf16_value_matches_reference() -> None:
    """All 65536 bf16 bit patterns, in blocks of neighbours and in shuffled blocks."""
    x = every_bf16()
    shuffled = x[torch.randperm(x.numel(), generator=_GEN)]
    assert_matches_reference(x.reshape(-1, 256))
    assert_matches_reference(shuffled.reshape(-1, 256))


def test_scale_specials_follow_te() -> None:
    """TE float_to_e8m0: 0 -> 0, NaN -> 0xFF, inf -> 0xFE; fp32 max gives 247 (0xFE is only
    reached through inf); a subnormal amax/448 <= 2^-127 gives 0, just above 2^-127 gives 1."""
    edge = torch.tensor([448 * 2.0**-127])  # amax/448 == 2^-127, the largest amax of byte 0
    up1 = torch.nextafter(edge, torch.tensor([1.0]))  # amax * fp32(1/448) still rounds to 2^-127
    up2 = torch.nextafter(up1, torch.tensor([1.0]))  # first amax whose product exceeds 2^-127
    finite_max = torch.finfo(torch.float32).max
    amax = torch.tensor([0.0, math.nan, math.inf, finite_max, 448.0, 449.0, 448 * 2.0**-126])
    amax = torch.cat([amax, edge, up1, up2])
    expected = torch.tensor([0, 0xFF, 0xFE, 247, 127, 128, 1, 0, 0, 1], dtype=torch.uint8)
    assert torch.equal(te_e8m0_scale(amax), expected)
    q = quantize_mxfp8(torch.tensor([[math.inf, -math.inf, math.nan, -math.nan] + [1.0] * 28]))
    assert q.scale.tolist() == [[0xFE]]
    assert q.data.view(torch.uint8)[0, :4].tolist() == [0x7E, 0xFE, 0x7F, 0x7F]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_scale_of_any_fp32_bit_pattern(patterns: list[int]) -> None:
    amax = torch.tensor(patterns, dtype=torch.int64).to(torch.int32).view(torch.float32).abs()
    expected = [ref_scale_byte(a) for a in amax.tolist()]
    assert torch.equal(te_e8m0_scale(amax), torch.tensor(expected, dtype=torch.uint8))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(width=32), min_size=BLOCK_SIZE, max_size=BLOCK_SIZE))
def test_any_fp32_block_matches_reference(values: list[float]) -> None:
    assert_matches_reference(torch.tensor([values], dtype=torch.float32))


def test_bf16_fake_quant_is_exact() -> None:
    """The bf16 result of fake_quantize_mxfp8 is the fp32 dequantized value, unrounded."""
    parts = [adversarial_fp32(), random_inputs(torch.float32), every_bf16().float()]
    x = torch.cat([part.reshape(-1, 128) for part in parts]).to(torch.bfloat16)
    fake = fake_quantize_mxfp8(x)
    assert fake.dtype == torch.bfloat16
    assert same_bits(fake.float(), quantize_mxfp8(x).dequantize(torch.float32))


def test_shapes_and_errors() -> None:
    x = torch.randn(2, 3, 64, generator=_GEN)
    q = quantize_mxfp8(x)
    assert isinstance(q, MXTensor)
    assert q.data.shape == (2, 3, 64) and q.scale.shape == (2, 3, 2)
    assert fake_quantize_mxfp8(x).dtype == torch.float32
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp8(torch.randn(4, 48))
    with pytest.raises(TypeError):
        quantize_mxfp8(torch.randn(4, 32).half())


# ---------------------------------------------------------------- 2. row invariance


@pytest.mark.parametrize("num_rows", [1, 2, 7, 33, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_are_quantized_independently(num_rows: int, dtype: torch.dtype) -> None:
    x = torch.randn(num_rows, 256, generator=_GEN)
    x = (x * torch.exp2(torch.randint(-30, 30, (num_rows, 1), generator=_GEN).float())).to(dtype)
    batch = quantize_mxfp8(x)
    for i in range(num_rows):
        row = quantize_mxfp8(x[i : i + 1])
        assert torch.equal(batch.scale[i : i + 1], row.scale)
        assert torch.equal(batch.data[i : i + 1].view(torch.uint8), row.data.view(torch.uint8))


# ---------------------------------------------------------------- 3. torchao cross-check


def test_torchao_rceil_agrees_except_tiny_blocks() -> None:
    """torchao's RCEIL gives TE's scale bytes and, except in blocks with 0 < amax <= 448*2^-127
    (scale byte 0, where torchao multiplies by 1 as TE did before v2.13 and TE now multiplies
    by 2^127), TE's data bits. Those blocks are the only difference."""
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    finite = adversarial_fp32()
    finite = finite[torch.isfinite(finite).all(-1)]  # torchao puts NaN into the amax; TE does not
    all_bf16 = every_bf16().float()
    all_bf16 = all_bf16[torch.isfinite(all_bf16)]
    x = torch.cat([finite.reshape(-1), random_inputs(torch.float32).reshape(-1), all_bf16])
    x = x[: x.numel() // 128 * 128].reshape(-1, 128).to(torch.bfloat16).contiguous()

    scale_ao, data_ao = to_mx(x, torch.float8_e4m3fn, BLOCK_SIZE, ScaleCalculationMode.RCEIL)
    ours = quantize_mxfp8(x)
    assert torch.equal(scale_ao.view(torch.uint8), ours.scale)

    amax = x.float().reshape(*ours.scale.shape, BLOCK_SIZE).abs().amax(-1)
    tiny = (amax > 0) & (amax <= 448 * 2.0**-127)
    differs = (data_ao.view(torch.uint8) != ours.data.view(torch.uint8)).reshape(amax.shape + (-1,))
    assert tiny.sum() >= 10  # the exclusion is exercised
    assert torch.equal(differs.any(-1), tiny)


# ---------------------------------------------------------------- 4. batch (in)variance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_tensor_is_batch_variant_mxfp8_is_not(dtype: torch.dtype) -> None:
    row = torch.randn(1, 256, generator=_GEN).to(dtype)
    loud = (1000 * torch.randn(1, 256, generator=_GEN)).to(dtype)
    batch = torch.cat([row, loud])

    assert not torch.equal(fake_quantize_fp8_tensor(batch)[:1], fake_quantize_fp8_tensor(row))
    assert torch.equal(fake_quantize_mxfp8(batch)[:1], fake_quantize_mxfp8(row))


def test_fp8_tensor_values() -> None:
    """amax maps to 448 and comes back exactly; zero tensors stay zero; dtype is kept."""
    x = torch.tensor([[0.5, -3.0, 1.0, 0.0]], dtype=torch.bfloat16)
    out = fake_quantize_fp8_tensor(x)
    assert out.dtype == torch.bfloat16 and out[0, 1].item() == -3.0
    assert torch.equal(fake_quantize_fp8_tensor(torch.zeros(3, 4)), torch.zeros(3, 4))


# ---------------------------------------------------------------- 5. straight-through gradient


@pytest.mark.parametrize("kind", ["mxfp8", "fp8_tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ste_passes_gradient_unchanged(kind, dtype: torch.dtype) -> None:
    x = torch.randn(4, 64, generator=_GEN).to(dtype).requires_grad_()
    upstream = torch.randn(4, 64, generator=_GEN).to(dtype)
    out = fake_quantizer(kind)(x)
    reference = {"mxfp8": fake_quantize_mxfp8, "fp8_tensor": fake_quantize_fp8_tensor}[kind]
    assert torch.equal(out.detach(), reference(x.detach()))
    out.backward(upstream)
    assert torch.equal(x.grad, upstream)

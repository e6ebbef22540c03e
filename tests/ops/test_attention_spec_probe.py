"""scripts/attention_spec_probe.py's candidate kernels, run by Triton's interpreter (fp32).

The probe times, on a GPU, kernels that claim zero mode's attention bits: a forward with
unmasked interior blocks and a decode combine with its loads unrolled. Here their logic is
held to that claim against `attention_kernels` (the same bits on the interpreter), and the
plain forward and flash-decoding's combine to SDPA's values.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import INTERPRETED, NOT_INTERPRETED

pytest.importorskip("triton")
if not INTERPRETED:
    pytest.skip(NOT_INTERPRETED, allow_module_level=True)

from zkl.ops.triton.attention_kernels import Tile, decode, prefill  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "attention_candidates.py"


def _probe():
    spec = importlib.util.spec_from_file_location("attention_candidates", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sdpa(q, k, v, causal: bool) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)


def test_unmasked_interior_forward_gives_the_kernels_bits():
    """Interior blocks without masks, chunks of 256 merged (or one chunk): the prefill's bits;
    the plain forward and the spec with P.V inside the MMA only SDPA's values."""
    probe = _probe()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 512, 4, 32, generator=g).transpose(1, 2)
    k, v = (torch.randn(1, 2, 512, 32, generator=g) for _ in range(2))
    pos = torch.arange(512).expand(1, 512)
    tile = Tile(64, 4, 1)
    chunked = probe.forward(q, k, v, 64, 64, 4, 1, "fma", 256)
    assert torch.equal(chunked, prefill(q, k, v, pos, tile=tile, chunk=256))
    one = probe.forward(q, k, v, 64, 64, 4, 1, "fma", 0)
    assert torch.equal(one, prefill(q, k, v, pos, tile=tile, chunk=1 << 30))
    assert not torch.equal(one, chunked)  # the chunk merge is a different order
    for mode, chunk in (("plain", 0), ("mma", 0), ("mma", 256)):
        got = probe.forward(q, k, v, 64, 64, 4, 1, mode, chunk)
        torch.testing.assert_close(got, _sdpa(q, k, v, True), rtol=1e-5, atol=1e-5)


def test_unrolled_combine_gives_decodes_bits_and_the_parallel_one_its_values():
    probe = _probe()
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 4, 32, generator=g).transpose(1, 2)
    k, v = (torch.randn(2, 2, 1100, 32, generator=g) for _ in range(2))
    pos, rows = torch.tensor([[1099], [700]]), torch.arange(2)
    want = decode(q, k, v, pos, rows, rows_per_program=16)
    for unroll in (1, 8):
        got = probe.decode_with(q, k, v, pos, rows, "unrolled", rows_per_program=16, unroll=unroll)
        assert torch.equal(got, want)
    parallel = probe.decode_with(q, k, v, pos, rows, "parallel", rows_per_program=16)
    torch.testing.assert_close(parallel, want, rtol=1e-5, atol=1e-5)


def test_prefix_decode_gives_the_one_chunk_prefills_bits():
    """Every query of a 300-token sequence decoded alone, its blocks in parallel: the rows
    of one causal prefill with a single online softmax, bit for bit; not those of the
    chunked spec (a different order), so the comparison can tell them apart."""
    probe = _probe()
    g = torch.Generator().manual_seed(2)
    seq = 300
    q = torch.randn(1, seq, 4, 32, generator=g).transpose(1, 2)
    k, v = (torch.randn(1, 2, seq, 32, generator=g) for _ in range(2))
    pos = torch.arange(seq).expand(1, seq)
    one = prefill(q, k, v, pos, tile=Tile(64, 4, 1), chunk=1 << 30)[0].transpose(0, 1)
    chunked = prefill(q, k, v, pos, tile=Tile(64, 4, 1))[0].transpose(0, 1)
    at = torch.tensor([0, 63, 64, 255, 256, 299])
    q_dec = q[0, :, at].unsqueeze(2).transpose(0, 1)  # [n, H, 1, D]: one query a row
    slots = torch.zeros(len(at), dtype=torch.long)
    for unroll in (1, 4):
        got = probe.decode_prefix(q_dec, k, v, at.view(-1, 1), slots, rows_per_program=16,
                                  unroll=unroll)[:, :, 0]  # fmt: skip
        assert torch.equal(got, one[at])
    assert not torch.equal(one[at], chunked[at])

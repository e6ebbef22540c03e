"""`zkl.ops.activations`: an element's bits never depend on its place in the tensor (torch's
CPU sigmoid / silu / softplus do: their vector loop's scalar tail rounds differently), the
values are torch's within rounding, and the gradient stays finite far from zero."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zkl.ops import activations

OURS = {"sigmoid": activations.sigmoid, "silu": activations.silu, "softplus": activations.softplus}
TORCH = {"sigmoid": torch.sigmoid, "silu": F.silu, "softplus": F.softplus}


def _values(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return (torch.randn(4096, generator=g) * 6).to(dtype)


def _moved(fn, x: torch.Tensor) -> int:
    """Elements whose bits differ between fn over all of x and fn over short pieces of it
    (lengths 1..40 at several offsets: the sizes of a decode step's rows)."""
    whole = fn(x)
    moved = 0
    for length in range(1, 41):
        for start in (0, 5, 16, 37, 300):
            piece = fn(x[start : start + length])
            moved += int((piece != whole[start : start + length]).sum())
    return moved


def _moved_by_threads(fn) -> int:
    """Rows of a [33, 1000] gate view (a fused gate/up projection's half, as the MLPs take
    it) computed together on two threads against each row alone: the threads split the
    tensor mid-row, which moves the scalar tail."""
    g = torch.Generator().manual_seed(6)
    fused = torch.randn(33, 2000, generator=g) * 6
    gate = fused[:, :1000]
    torch.set_num_threads(2)
    whole = fn(gate)
    return sum(int((fn(gate[r : r + 1]) != whole[r : r + 1]).sum()) for r in range(33))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(OURS))
def test_an_element_keeps_its_bits_wherever_it_sits(name, dtype):
    assert _moved(OURS[name], _values(dtype)) == 0
    assert _moved_by_threads(OURS[name]) == 0


FP32_LANES = {"AVX512": 16, "AVX2": 8}  # torch's CPU capability -> its vector loop's width


def test_torch_own_kernels_move_bits_with_the_place():
    """The cause: torch's own kernels round an element differently in a short tensor than in
    a long one (a vector loop's scalar tail), and on two threads by where a thread's share
    starts, where a [33, 1000] gate row is not a whole number of vectors: so on AVX-512 (16
    lanes; 1000 = 62 x 16 + 8) and not on AVX2 (8 lanes). Without a vector loop
    (`ATEN_CPU_CAPABILITY=default`) nothing moves, and the fix has nothing to remove."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in FP32_LANES:
        pytest.skip(f"torch's CPU kernels here ({capability}) have no vector loop zkl knows")
    x = _values(torch.float32)
    for name in OURS:
        assert _moved(TORCH[name], x) > 0, name
    if 1000 % FP32_LANES[capability]:
        assert _moved_by_threads(F.silu) > 0
    else:
        assert _moved_by_threads(F.silu) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_values_are_torch_within_rounding_and_in_the_input_dtype(dtype):
    x = _values(torch.float32).clamp(-60, 60).to(dtype)
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
    for name in OURS:
        got = OURS[name](x)
        assert got.dtype == dtype
        want = TORCH[name](x.double())
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_gradients_are_torch_and_finite_far_below_zero():
    x = torch.tensor([-1000.0, -100.0, -89.0, -20.0, -1.0, 0.0, 1.0, 20.0, 100.0, 1000.0])
    for name in OURS:
        ours = x.clone().requires_grad_()
        OURS[name](ours).sum().backward()
        ref = x.double().requires_grad_()
        TORCH[name](ref).sum().backward()
        assert torch.isfinite(ours.grad).all(), name
        torch.testing.assert_close(ours.grad.double(), ref.grad, rtol=1e-6, atol=1e-30)

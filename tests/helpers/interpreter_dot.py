"""`tl.dot` under the Triton interpreter, one row at a time, so a row's bits are its own.

The kernels' parity (prefill == decode == scoring, a 16-row tile == the fixed tile) rests on
a dot product whose row gets the same bits wherever it sits in the tile, as a GPU's FMA and
MMA dot products give. The interpreter computes `tl.dot` with one `np.matmul`, i.e. the
host's OpenBLAS sgemm, whose kernel OpenBLAS picks from the CPU at run time: on its Haswell
and Zen kernels (CPUs without AVX-512) rows 6..15 of a [16, 16] @ [16, 64] product get other
bits than the same row at index 0, and on every kernel a row alone (a matrix-vector product)
gets other bits than in a 16-row product. A query decoded in row 0 then differs from the same
query scored in row 15, on some machines only. Each row as its own [1, K] @ [K, N] product,
both operands in C order, depends on nothing but that row and the other operand.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from triton.runtime import interpreter


def install() -> None:
    """Route the interpreter's `tl.dot` through `row_by_row` (idempotent)."""
    builder = interpreter.InterpreterBuilder
    if not getattr(builder.create_dot, "row_by_row", False):
        builder.create_dot = row_by_row(builder.create_dot)


def row_by_row(whole: Callable) -> Callable:
    """`whole` (the interpreter's `create_dot`) on [..., M, 1, K] @ [..., 1, K, N]: M products
    of one row each, in one call, with `whole`'s own casts and accumulator."""

    def create_dot(self, a, b, d, *args):
        out = whole(self, _expand(a, -2), _expand(b, -3), _expand(d, -2), *args)
        return interpreter.TensorHandle(out.data.squeeze(-2), out.dtype)

    create_dot.row_by_row = True
    create_dot.whole = whole
    return create_dot


def _expand(handle, axis: int):
    """A new axis, in C order: a TMA load's transposed view and a row-major one give one BLAS
    call (a product by the transposed matrix sums in another order)."""
    data = np.ascontiguousarray(np.expand_dims(handle.data, axis))
    return interpreter.TensorHandle(data, handle.dtype)
